"""Run the billing job as a real driver process and SIGKILL it at a chosen moment."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import ClassVar

from tests import ROOT

# Spark 4.3 gives a foreachBatch worker 10 s (fixed) to connect back to the server;
# its imports have taken longer on a loaded machine. Then the query fails before any
# batch ran, and the tests start the client again, as an operator would.
NO_WORKER = "Python worker failed to connect back"


def billing_command(*args: str) -> list[str]:
    """The driver's command line; its database goes in DATABASE_URL (``Driver``), since a
    URL with a password in the arguments is refused (ps would show it)."""
    return [
        sys.executable,
        "-m",
        "spark_outbox",
        "--log-level",
        "WARNING",
        "spark",
        "run",
        "billing",
        *args,
    ]


def executor_env(**env: str) -> dict[str, str]:
    """A driver's environment giving its executors on a cluster ``env``, for this job
    alone (``spark.executorEnv``, which ``spark-submit`` reads from PYSPARK_SUBMIT_ARGS):
    the cluster's workers are shared by the tests."""
    confs = [a for k, v in env.items() for a in ("--conf", f"spark.executorEnv.{k}={v}")]
    return {"PYSPARK_SUBMIT_ARGS": " ".join([*confs, "pyspark-shell"])}


class Driver:
    """A driver subprocess whose stderr phase lines (``outbox-phase: x``) can be awaited.

    Every driver started is remembered, and ``stop_all`` (after each test, from
    tests/spark/conftest.py) kills what a failed test left running, its JVM with it:
    each driver is the leader of its own process group."""

    started: ClassVar[list[Driver]] = []

    def __init__(self, command: list[str], db_url: str, env: dict[str, str] | None = None) -> None:
        full_env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "OUTBOX_SPARK_PHASES": "print",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # kill_all() reaches its JVM and Python workers too
        )
        Driver.started.append(self)
        self.lines: queue.Queue[str] = queue.Queue()
        self.reached = ""  # the phase line wait_for last matched
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                self.stderr.append(line)
                if line.startswith("outbox-phase:"):
                    self.lines.put(line.strip())
        except ValueError:  # finish()'s communicate() read the pipe to its end and closed it
            return

    def wait_for(self, phase: str, timeout_s: float = 600) -> bool:
        """True once the driver prints ``phase``; False if it exited first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    return False
                continue
            if line.split(": ", 1)[1].split(" ")[0] == phase:
                self.reached = line
                return True
        raise TimeoutError(f"driver never reached {phase}; stderr tail: {self.stderr[-20:]}")

    def forget_phases(self) -> None:
        """Drop the phase lines printed so far: the next ``wait_for`` sees only newer ones."""
        with contextlib.suppress(queue.Empty):
            while True:
                self.lines.get_nowait()

    def kill(self) -> None:
        """A real SIGKILL of the driver process (its JVM exits when its stdin closes)."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def kill_all(self) -> None:
        """SIGKILL the driver, its JVM and every Python worker: a lost host. (A data
        source commits in a Python worker of the JVM, which a kill of the driver
        process alone would leave running.)"""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def reached_pid(self) -> int:
        """The process that printed the phase line ``wait_for`` last matched."""
        return int(self.reached.split("(pid ", 1)[1].split(",", 1)[0])

    def finish(self, timeout_s: float = 900) -> str:
        out, _ = self.proc.communicate(timeout=timeout_s)
        if self.proc.returncode != 0:
            raise AssertionError(f"driver failed ({self.proc.returncode}): {self.stderr[-30:]}")
        return out

    @classmethod
    def stop_all(cls) -> None:
        """SIGKILL every driver still running, with its process group (its JVM)."""
        for driver in cls.started:
            if driver.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(driver.proc.pid, signal.SIGKILL)
                driver.proc.wait(timeout=30)
        cls.started.clear()
