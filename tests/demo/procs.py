"""Start ``outbox`` commands as real subprocesses and read their announced address."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests import ROOT


@contextmanager
def outbox_process(*args: str, env: dict[str, str] | None = None) -> Iterator[tuple[Any, dict]]:
    """Run ``outbox ARGS``; yield (process, the JSON line it printed once listening).

    Stops it with SIGTERM at the end and checks it exited cleanly (0).
    """
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"outbox {' '.join(args)} exited early: {proc.communicate()[1]}")
        yield proc, json.loads(line)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, f"exit {proc.returncode}: {err}"
