"""docker-compose.yml and the Dockerfile, checked offline (no Docker engine runs here).

Debian's ``docker-compose`` (v1.29) validates a file without an engine with
``docker-compose config``; .ci/system-deps.sh installs it when it can.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]  # the repository


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
