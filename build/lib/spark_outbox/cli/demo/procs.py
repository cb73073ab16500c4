"""Child processes of the demo: every component runs as its own process, as in production.

That is what lets ``--crash`` kill one with SIGKILL. Each child gets its own
process group (so a Spark driver dies with its JVM), its output goes to a log
file under the run directory, and a failure raises ``DemoFailed`` with the tail
of that log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_outbox.core.errors import OutboxError


class DemoFailed(OutboxError):
    """A demo step failed; the message says which and shows the end of its log."""


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Child:
    """One ``outbox ...`` subprocess with its log file."""

    def __init__(
        self,
        name: str,
        args: list[str],
        env: Mapping[str, str],
        log_dir: Path,
        *,
        announces: bool = False,
    ) -> None:
        """``announces``: a server whose first stdout line is read (else stdout goes to a file)."""
        self.name = name
        self.args = args
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self.out_path = log_dir / f"{name}.out"
        self._log = self.log_path.open("ab")
        self._out = None if announces else self.out_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "spark_outbox", *args],
            env=dict(env),
            stdout=subprocess.PIPE if announces else self._out,
            stderr=self._log,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def announced(self, timeout_s: float = 60) -> dict[str, Any]:
        """The JSON line a server prints once listening."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # the servers print it within a second or two
        if not line:
            self.proc.wait(timeout=timeout_s)
            raise DemoFailed(f"{self.name} exited ({self.proc.returncode}):\n{tail(self.log_path)}")
        return dict(json.loads(line))

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout_s: float | None = None) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self._drain_stdout()
        return code

    def check(self, timeout_s: float | None = None) -> None:
        """Wait for a one-shot step and raise with its log if it failed."""
        code = self.wait(timeout_s)
        if code != 0:
            raise DemoFailed(
                f"`outbox {' '.join(self.args)}` failed (exit {code}); log {self.log_path}:\n"
                + tail(self.log_path)
            )

    def stop(self, timeout_s: float = 40) -> int:
        """SIGTERM, the clean shutdown every long-running command implements."""
        if self.running():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.wait(10)

    def kill(self) -> None:
        """SIGKILL the whole process group: the crash ``--crash`` is about."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def output(self) -> str:
        """What a one-shot step printed on stdout."""
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def _drain_stdout(self) -> None:
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            rest = self.proc.stdout.read()
            self.proc.stdout.close()
            self.out_path.write_bytes(rest)
        for f in (self._log, self._out):
            if f is not None and not f.closed:
                f.close()


def run_step(
    name: str, args: list[str], env: Mapping[str, str], log_dir: Path, timeout_s: float = 900
) -> Child:
    """Run a one-shot command to completion; raise ``DemoFailed`` when it fails."""
    child = Child(name, args, env, log_dir)
    child.check(timeout_s)
    return child


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return False
