"""docker-compose.yml and the Dockerfile, checked offline (no Docker engine runs here).

Debian's ``docker-compose`` (v1.29) validates a file without an engine with
``docker-compose config``; .ci/system-deps.sh installs it when it can.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.engine import Engine

from tests import ROOT
from tests.demo import compose_rules as rules

COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    COMPOSE is None,
    reason="Debian's docker-compose is not installed (`apt-get install docker-compose`; "
    ".ci/system-deps.sh does it as root)",
)


def compose_config(path: Path) -> subprocess.CompletedProcess[str]:
    assert COMPOSE is not None
    return subprocess.run(
        [COMPOSE, "-f", str(path), "config"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=path.parent,
        env={**os.environ, "COMPOSE_PROJECT_NAME": "outbox"},
    )


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    result = compose_config(ROOT / "docker-compose.yml") if COMPOSE else None
    if result is None:
        return yaml.safe_load((ROOT / "docker-compose.yml").read_text())  # type: ignore[no-any-return]
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)  # type: ignore[no-any-return]


@needs_compose
def test_docker_compose_accepts_the_file_and_it_has_every_role(config: dict[str, Any]) -> None:
    assert set(config["services"]) >= {
        "postgres", "migrate", "spark-master", "spark-worker", "billing",
        "dispatcher", "api", "receiver", "mailcatcher",
    }  # fmt: skip
    assert config["services"]["dispatcher"]["deploy"]["replicas"] == 2
    billing = config["services"]["billing"]
    assert "spark://spark-master:7077" in billing["command"]
    # Executors on the worker connect back to the driver at SPARK_LOCAL_IP.
    assert billing["environment"]["SPARK_LOCAL_IP"] == "billing"


@needs_compose
def test_a_broken_compose_file_is_refused(tmp_path: Path) -> None:
    broken = (
        (ROOT / "docker-compose.yml")
        .read_text()
        .replace("condition: service_healthy", "condition: service_happy", 1)
    )
    (tmp_path / "docker-compose.yml").write_text(broken)
    result = compose_config(tmp_path / "docker-compose.yml")
    assert result.returncode != 0
    assert "service_happy" in result.stderr


def test_workers_start_only_after_the_migration_completed(config: dict[str, Any]) -> None:
    for name in ("dispatcher", "api", "billing"):
        depends = config["services"][name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
    assert config["services"]["migrate"]["command"] == ["outbox", "db", "upgrade"]


def test_no_secret_is_written_into_the_compose_file(config: dict[str, Any]) -> None:
    for name, service in config["services"].items():
        env = service.get("environment") or {}
        for var, value in env.items():
            if var.endswith("_FILE"):
                assert str(value).startswith("/run/secrets/"), (name, var)
            assert not re.search(r"PASSWORD$|SECRET$|TOKEN$", var), (name, var)
        url = env.get("DATABASE_URL", "postgresql://u@h/d")
        assert re.match(r"postgresql://[^:@/]+@", url), f"{name}: DATABASE_URL carries a password"


def test_every_path_the_dockerfile_copies_exists() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    sources = [
        src
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
    ]
    assert sources, "no COPY lines found"
    missing = [s for s in sources if not (ROOT / s).exists()]
    assert missing == []
    assert not re.search(r"^(ENV|ARG)\s+\S*(PASSWORD|SECRET|TOKEN)", dockerfile, re.M)


def test_the_entrypoint_turns_secret_files_into_variables(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t")
    script = str(ROOT / "docker" / "entrypoint.sh")
    ok = subprocess.run(
        ["sh", script, "sh", "-c", 'echo "$PGPASSWORD ${PGPASSWORD_FILE:-unset}"'],
        env={"PATH": os.environ["PATH"], "PGPASSWORD_FILE": str(secret)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ok.returncode, ok.stdout.strip()) == (0, "s3cr3t unset")
    missing = subprocess.run(
        ["sh", script, "true"],
        env={"PATH": os.environ["PATH"], "PGPASSWORD_FILE": str(tmp_path / "nope")},
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1
    assert "PGPASSWORD_FILE" in missing.stderr and "mount the secret" in missing.stderr


def test_prometheus_scrapes_every_dispatcher_and_the_api(config: dict[str, Any]) -> None:
    dispatcher = config["services"]["dispatcher"]
    command = dispatcher["command"]
    port = command[command.index("--metrics-port") + 1]
    # Bound to every interface inside its container, reachable in the compose network
    # only: exposed, never published on the host.
    assert dispatcher["environment"]["OUTBOX_METRICS_HOST"] == "0.0.0.0"
    assert port in [str(p) for p in dispatcher["expose"]] and "ports" not in dispatcher
    prometheus = config["services"]["prometheus"]
    mounted = {
        str(v).split(":")[0] if isinstance(v, str) else v["source"]: v
        for v in prometheus["volumes"]
    }
    assert any(str(src).endswith("docker/prometheus.yml") for src in mounted)
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    (dns,) = jobs["outbox-dispatcher"]["dns_sd_configs"]
    assert dns["names"] == ["dispatcher"] and str(dns["port"]) == port
    (api,) = jobs["outbox-api"]["static_configs"]
    assert api["targets"] == ["api:8000"]
    assert set(prometheus["networks"]) == set(dispatcher["networks"])
    # The shipped alert rules, mounted where prometheus.yml's rule_files looks.
    [rules] = scrape["rule_files"]
    [target] = [
        v["target"] if isinstance(v, dict) else str(v).split(":")[1]
        for src, v in mounted.items()
        if str(src).endswith("monitoring/alerts.yml")
    ]
    assert target == rules


# -- the file as written: strict YAML, the Compose Specification, our own rules ----------

YAMLLINT = importlib.util.find_spec("yamllint") is not None
CHECK_JSONSCHEMA = importlib.util.find_spec("check_jsonschema") is not None
needs_check_jsonschema = pytest.mark.skipif(
    not CHECK_JSONSCHEMA,
    reason="check-jsonschema is not installed (the dev extra has it: `make install`)",
)


@pytest.fixture(scope="module")
def raw() -> dict[str, Any]:
    """docker-compose.yml as Compose v2 reads it: no key twice, merge keys resolved."""
    return rules.load((ROOT / "docker-compose.yml").read_text())


def yaml_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
         "*.yml", "*.yaml", ".yamllint"],
        cwd=ROOT, capture_output=True, check=True,
    )  # fmt: skip
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_every_yaml_file_loads_with_no_key_given_twice() -> None:
    files = yaml_files()
    assert ROOT / "docker-compose.yml" in files and ROOT / "docker" / "prometheus.yml" in files
    for path in files:
        rules.load(path.read_text())


def test_a_key_given_twice_is_refused_though_a_merged_key_may_be_overridden() -> None:
    merged = "base: &b {restart: always, image: x}\none:\n  <<: *b\n  restart: 'no'\n"
    assert rules.load(merged)["one"] == {"restart": "no", "image": "x"}
    twice = "env:\n  OUTBOX_METRICS_HOST: 0.0.0.0\n  OUTBOX_METRICS_HOST: 0.0.0.0\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="'OUTBOX_METRICS_HOST' twice"):
        rules.load(twice)


@pytest.mark.skipif(not YAMLLINT, reason="yamllint is not installed (the dev extra has it)")
def test_the_yaml_lint_refuses_a_key_given_twice_and_passes_the_repository(
    tmp_path: Path,
) -> None:
    config = str(ROOT / ".yamllint")
    twice = tmp_path / "twice.yml"
    twice.write_text("env:\n  A: 1\n  A: 2\n")
    lint = [sys.executable, "-m", "yamllint", "--strict", "-c", config]
    refused = subprocess.run([*lint, str(twice)], capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "key-duplicates" in refused.stdout
    clean = subprocess.run([*lint, "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert (clean.returncode, clean.stdout) == (0, "")


def check_compose_schema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@needs_check_jsonschema
def test_the_compose_specification_schema_accepts_the_file_and_refuses_a_typo(
    tmp_path: Path,
) -> None:
    ok = check_compose_schema(ROOT / "docker-compose.yml")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(
        (ROOT / "docker-compose.yml")
        .read_text()
        .replace("condition: service_healthy", "condition: service_happy", 1)
    )
    refused = check_compose_schema(broken)
    assert refused.returncode == 1 and "service_happy" in refused.stdout


def test_every_command_is_a_real_cli_command(raw: dict[str, Any]) -> None:
    assert rules.command_problems(raw["services"]) == []
    # The check reached into the one-shot's shell script.
    script = rules.outbox_commands(rules.argv_of(raw["services"]["register-endpoints"]))
    assert [c[:4] for c in script if "add" in c] == [
        ["outbox", "endpoints", "add", "webhook"],
        ["outbox", "endpoints", "add", "email"],
    ]


def test_every_variable_the_file_sets_is_one_the_code_reads(raw: dict[str, Any]) -> None:
    known = rules.variables_the_code_reads(ROOT)
    assert {"DATABASE_URL", "OUTBOX_METRICS_HOST", "OUTBOX_RECEIVER_SECRET"} <= known
    assert rules.environment_problems(raw["services"], known) == []


def test_no_secret_reaches_a_command_line(raw: dict[str, Any]) -> None:
    assert rules.secret_problems(raw["services"]) == []
    register = raw["services"]["register-endpoints"]
    assert "--secret-env WEBHOOK_SECRET" in rules.argv_of(register)[2]
    assert register["environment"]["WEBHOOK_SECRET_FILE"] == "/run/secrets/webhook_secret"
    assert "webhook_secret" in register["secrets"]


def test_every_dependency_exists_and_can_be_waited_for(raw: dict[str, Any]) -> None:
    assert rules.depends_problems(raw["services"]) == []
    assert rules.healthcheck_problems(raw["services"]) == []


def test_billing_starts_after_the_endpoints_are_registered_and_the_master_is_healthy(
    raw: dict[str, Any],
) -> None:
    services = raw["services"]
    billing = services["billing"]["depends_on"]
    assert billing["register-endpoints"]["condition"] == "service_completed_successfully"
    assert billing["spark-master"]["condition"] == "service_healthy"
    register = services["register-endpoints"]
    assert register["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    # Started by a plain `docker compose up`, as billing is: no profile between them.
    assert "profiles" not in register and "profiles" not in services["billing"]
    # Its --input exists before the first file does: the image makes it in the volume.
    command = rules.argv_of(services["billing"])
    made = re.search(r"mkdir -p ([^&\n]+)", (ROOT / "Dockerfile").read_text())
    assert made is not None
    assert command[command.index("--input") + 1] in made.group(1).split()
    assert any(v.endswith(":/data") for v in services["billing"]["volumes"])


def test_the_rules_catch_a_broken_file(raw: dict[str, Any]) -> None:
    services = copy.deepcopy(raw["services"])
    dispatcher = services["dispatcher"]
    dispatcher["command"] = ["outbox", "dispatcher", "runn"]
    dispatcher["environment"]["OUTBOX_METRICS_HOTS"] = "0.0.0.0"
    # (YAML aliases share one mapping between services: give each its own.)
    dispatcher["depends_on"] = {
        **dispatcher["depends_on"],
        "nosuch": {"condition": "service_started"},
        "receiver": {"condition": "service_healthy"},
    }
    services["api"]["depends_on"] = {"dispatcher": {"condition": "service_completed_successfully"}}
    add = ["outbox", "endpoints", "add"]
    services["receiver"]["command"] = [*add, "webhook", "w", "--url", "http://r/", "--secret", "x"]
    mail = ["email", "m", "--smtp-host", "h", "--smtp-port", "25", "--mail-from", "a@b"]
    services["mailcatcher"]["command"] = [*add, *mail, "--smtp-password-env", "NOPE"]
    services["generate"]["profiles"] = ["sample-data"]
    services["billing"]["depends_on"]["generate"] = {"condition": "service_started"}
    services["spark-master"]["healthcheck"]["test"][3] = "import socket; socket.("
    (wrong_command,) = rules.command_problems(services)
    assert wrong_command.startswith("dispatcher: `outbox dispatcher runn`: ")
    assert "invalid choice: 'runn'" in wrong_command
    known = rules.variables_the_code_reads(ROOT)
    assert rules.environment_problems(services, known) == [
        "dispatcher: OUTBOX_METRICS_HOTS is set, and no code reads OUTBOX_METRICS_HOTS",
        "mailcatcher: --smtp-password-env NOPE, and NOPE is not set",
    ]
    assert rules.secret_problems(services) == [
        "receiver: --secret puts a secret on the command line",
    ]
    assert rules.depends_problems(services) == [
        "billing: generate is behind profiles ['sample-data']",
        "dispatcher: depends on 'nosuch', which is not a service",
        "dispatcher: waits for receiver to be healthy; it has no healthcheck",
        "api: waits for dispatcher to complete; it restarts",
    ]
    assert len(rules.healthcheck_problems(services)) == 1


def test_the_endpoint_registration_runs_on_every_up_and_keeps_what_exists(
    raw: dict[str, Any], db_url: str, engine: Engine, tmp_path: Path
) -> None:
    """register-endpoints' own script, run twice against a real database as `up`
    would: the first run registers both endpoints with the secret from the
    environment, the second succeeds and changes nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "outbox"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m spark_outbox "$@"\n')
    shim.chmod(0o755)
    secret = "whsec_" + "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env |= {"PATH": f"{bin_dir}:{env['PATH']}", "DATABASE_URL": db_url, "WEBHOOK_SECRET": secret}
    argv = rules.argv_of(raw["services"]["register-endpoints"])

    def registered() -> list[tuple[str, str | None]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT name, signing_secret FROM endpoints ORDER BY name"))
            actions = conn.execute(sa.text("SELECT count(*) FROM operator_actions")).scalar_one()
            return [*((r.name, r.signing_secret) for r in rows), ("operator_actions", str(actions))]

    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    after_first = registered()
    assert after_first[:2] == [("billing-email", None), ("billing-webhook", secret)]
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr
    assert registered() == after_first
