# The two commands: `make test` and `make demo`. Each creates .venv when needed,
# installs the project with its extras, makes sure the system pieces exist
# (PostgreSQL server binaries, Java for Spark), then runs.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
ARGS ?=
PYTEST_ARGS ?=
# Test processes: two on a two-core machine took the suite from 23m53s in one to 15-16
# min (2026-11-27); the drills are CPU-bound, so more processes than cores gain little.
TEST_WORKERS ?= 2

export SPARK_LOCAL_IP ?= 127.0.0.1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: test demo bench lint system-deps install clean db-stop

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[spark,connect,api,demo,dev,bench,otel]'
	@touch $(STAMP)

install: $(STAMP)

# PostgreSQL server binaries and a Java runtime: installed from Debian's packages
# when running as root on Debian without them; otherwise a message says what to do.
system-deps:
	@sh .ci/system-deps.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/yamllint --strict .

test: $(STAMP) system-deps lint
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

demo: $(STAMP) system-deps
	$(BIN)/outbox --log-format text demo $(ARGS)

bench: $(STAMP) system-deps
	$(BIN)/python -m bench $(ARGS)

# Your private cluster: one per user (`outbox db status` says where).
db-stop: $(STAMP)
	$(BIN)/outbox db stop

# The test suite's own private cluster lives in .outbox (tests/conftest.py); yours is
# left alone (`make db-stop` stops it).
clean:
	test ! -x $(BIN)/outbox || $(BIN)/outbox --state-dir .outbox db stop
	rm -rf .outbox $(VENV)
