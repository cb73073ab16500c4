"""Run the real CLI (`python -m spark_outbox dispatcher run`) as child processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from tests import ROOT


def worker_env(db_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env |= {
        "DATABASE_URL": db_url,
        "OUTBOX_SSRF_ALLOW_NETWORKS": "127.0.0.0/8",
        "OUTBOX_LEASE_S": "5",
        "OUTBOX_POLL_INTERVAL_S": "0.2",
        "OUTBOX_HEARTBEAT_INTERVAL_S": "0.5",
        "OUTBOX_RETRY_SCHEDULE_S": "0,0.2,0.2",
        "OUTBOX_SHUTDOWN_TIMEOUT_S": "5",
        "OUTBOX_LOG_LEVEL": "WARNING",
        # One worker per command unless a test asks for a supervisor (--processes N).
        "OUTBOX_PROCESSES": "1",
    }
    return env | extra


def start(env: dict[str, str], *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115 (owned by the child)
    return subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", "dispatcher", "run", *args],
        cwd=ROOT,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
    )


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes], timeout_s: float = 20) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout_s)


def enqueue_many(engine: Engine, n: int, endpoint: str = "hook") -> list[str]:
    """``n`` effects in one statement (keys are 64 hex chars, like real ones)."""
    with engine.begin() as conn:
        keys = conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT lpad(to_hex(g), 64, '0'), :endpoint,"
                " jsonb_build_object('n', g), 'x' FROM generate_series(1, :n) g"
                " RETURNING idempotency_key"
            ),
            {"n": n, "endpoint": endpoint},
        ).scalars()
        return list(keys)


def states(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT state, count(*) FROM effects GROUP BY state"))
        return {r[0]: int(r[1]) for r in rows}
