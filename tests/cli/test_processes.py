"""The real CLI as a child process: closed pipes, one-line errors, what a dispatcher
says at start and exports, compared with what the docs list."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from spark_outbox.api.app import create_app
from spark_outbox.cli.main import CLOSED_PIPE_EXIT
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.settings import Settings
from tests import ROOT
from tests.dispatcher import procs

DOCS = ("README.md", "docs/api.md", "docs/dispatcher.md", "docs/operations.md", "docs/design.md")
METRIC = re.compile(r"`(outbox_[a-z_]+)(?:\{[^`]*\})?`")


def _outbox(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spark_outbox", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_db_sql_into_a_closed_pipe_exits_quietly() -> None:
    """``outbox db sql | head -1``: no BrokenPipe traceback, the exit status of SIGPIPE."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", "db", "sql"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    code = proc.wait(timeout=60)
    assert first.strip() and proc.stderr.read() == b""
    assert code == CLOSED_PIPE_EXIT


def test_a_taken_metrics_port_is_a_one_line_error(db_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _outbox(
            "dispatcher", "run", "--until-idle", "--metrics-port", str(port),
            env=procs.worker_env(db_url),
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr


def test_a_missing_batch_input_file_is_a_one_line_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "events-2026-01-01.json").write_text("{}\n")
    done = _outbox(
        "spark", "run", "billing", "--input", str(tmp_path), "--date", "2026-01-09",
        env=procs.worker_env("postgresql://nobody@127.0.0.1:9/none"),
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert f"no input file {tmp_path / 'events-2026-01-09.json'}" in done.stderr
    assert "found: events-2026-01-01.json" in done.stderr


def test_the_billing_job_refuses_to_run_before_its_endpoints_exist(
    db_url: str, tmp_path: Path
) -> None:
    """Without them every effect would be committed as a reject, and a re-run of the
    committed batch is a replay: the newcomer's trap, stopped before Spark starts."""
    (tmp_path / "events-2026-01-01.json").write_text("{}\n")
    done = _outbox(
        "spark", "run", "billing", "--input", str(tmp_path), "--date", "2026-01-01",
        env=procs.worker_env(db_url),
    )  # fmt: skip
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "billing-webhook, billing-email are not registered" in done.stderr
    assert "outbox endpoints add webhook billing-webhook" in done.stderr


def documented_metric_names() -> set[str]:
    return {name for doc in DOCS for name in METRIC.findall((ROOT / doc).read_text())}


def _exported(text: str) -> set[str]:
    """The names a query uses: counters with ``_total``, histograms by their base name;
    not the ``_created`` timestamps prometheus_client adds to an unlabelled histogram
    (the parser gives them a family of their own)."""
    return {
        f"{f.name}_total" if f.type == "counter" else f.name
        for f in text_string_to_metric_families(text)
        if not f.name.endswith("_created")
    }


def test_a_dispatcher_logs_its_allow_list_and_exports_the_metrics_the_docs_list(
    db_url: str, settings: Settings
) -> None:
    port = free_port()
    env = procs.worker_env(db_url, OUTBOX_LOG_LEVEL="INFO")
    run = ["dispatcher", "run", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", *run],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        # stderr is a pipe, not a terminal: JSON lines.
        started = [json.loads(proc.stderr.readline()) for _ in range(2)]
        procs.wait_for(lambda: _up(port), 30, "the metrics server")
        dispatcher = _exported(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        assert procs.stop(proc) == 0  # type: ignore[arg-type]
    allow = next(e for e in started if e.get("event") == "dispatcher.ssrf_allow_networks")
    assert allow["ssrf_allow_networks"] == "127.0.0.0/8" and "127.0.0.0/8" in allow["msg"]
    with TestClient(create_app(settings)) as client:
        api = _exported(client.get("/metrics").text)
    assert documented_metric_names() == dispatcher | api | _verify_exports(db_url)


def _verify_exports(db_url: str) -> set[str]:
    """What ``outbox verify`` serves while it runs."""
    port = free_port()
    run = ["verify", "--interval", "0.2", "--metrics-port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", *run],
        cwd=ROOT,
        env=procs.worker_env(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        procs.wait_for(lambda: _up(port), 30, "the verify metrics server")
        return _exported(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
    finally:
        proc.terminate()
        proc.wait(10)


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
