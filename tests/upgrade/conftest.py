"""Upgrade fixtures: the previous release installed, databases at its schema, and the
processes of both releases, every one stopped whatever happens."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db
from tests import ROOT
from tests.spark.conftest import spark  # noqa: F401  (the same session-wide fixture here)
from tests.upgrade import previous


@pytest.fixture(scope="session")
def previous_release() -> previous.Installed:
    return previous.install(previous.recorded())


@pytest.fixture
def empty_url(server_url: str) -> Iterator[str]:
    url = scratch.create_empty_database(server_url, prefix="upgrade")
    yield url
    scratch.drop_database(server_url, scratch.database_name(url))


@pytest.fixture
def old_schema_url(empty_url: str) -> str:
    """A database at the previous release's schema: this checkout's migrations up to its
    head, which are the same files (a released revision is never edited)."""
    db.upgrade(empty_url, f"outbox@{previous.recorded().revision}")
    return empty_url


class Processes:
    """Child processes with their output in files; ``stop_all`` ends the ones still
    running (SIGTERM, then SIGKILL after a grace)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        out = (self.logs / f"{name}.log").open("wb")
        try:
            proc = subprocess.Popen(argv, cwd=self.logs, env=env, stdout=out, stderr=out)
        finally:
            out.close()
        self.running[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    def first_json(self, name: str, timeout_s: float = 60) -> dict[str, Any]:
        """The first JSON object the process printed (an announced address)."""
        wait_for(lambda: "{" in self.log(name) or self.running[name].poll() is not None,
                 timeout_s, f"{name} to start")  # fmt: skip
        for line in self.log(name).splitlines():
            if line.startswith("{"):
                found: dict[str, Any] = json.loads(line)
                return found
        raise AssertionError(f"{name} printed no JSON line: {self.log(name)[-3000:]}")

    def stop(self, name: str, timeout_s: float = 60) -> int:
        proc = self.running.pop(name)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise AssertionError(
                f"{name} did not stop on SIGTERM: {self.log(name)[-3000:]}"
            ) from None

    def stop_all(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in self.running.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.running.clear()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    try:
        yield procs
    finally:
        procs.stop_all()


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def new_outbox(*args: str) -> list[str]:
    """This release's ``outbox ARGS`` (this checkout, this environment)."""
    return [sys.executable, "-m", "spark_outbox", *args]


def run(argv: list[str], env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
