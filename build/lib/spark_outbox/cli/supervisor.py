"""``outbox dispatcher run --processes N``: one supervisor, N worker processes.

A dispatcher uses every core of its host without an operator starting N
processes by hand. The supervisor starts N children (``outbox dispatcher run
--processes 1``, each a complete worker with its own event loop, pool and
listener), forwards SIGTERM/SIGINT to all of them, and exits 0 only when all
exited 0. It restarts none: when one child fails, the others are stopped and
the supervisor exits non-zero, so the real supervisor (systemd, Kubernetes)
restarts the whole dispatcher. Children die with the supervisor (Linux
``PR_SET_PDEATHSIG``): a ``kill -9`` of the supervisor is a ``kill -9`` of the
dispatcher, whose leases then expire as for any crash.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


def host_cores() -> int:
    """CPU cores this process may run on (the container's, where it is limited by affinity)."""
    return len(os.sched_getaffinity(0))


def die_with(parent_pid: int) -> None:
    """In a child: be killed when the supervisor dies, and exit if it already has."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(1)


def supervise(commands: Sequence[Sequence[str]], envs: Sequence[Mapping[str, str]]) -> int:
    """Run the children until all exit; 0 only when every one exited 0."""
    children = [
        subprocess.Popen([*cmd, "--supervised-by", str(os.getpid())], env=dict(env))
        for cmd, env in zip(commands, envs, strict=True)
    ]
    log.info(
        "dispatcher started",
        extra={"event": "supervisor.started", "processes": len(children)},
    )

    def forward(signum: int, _frame: Any) -> None:
        _signal_all(children, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    codes: dict[int, int] = {}
    while len(codes) < len(children):
        for child in children:
            code = child.poll()
            if code is None or child.pid in codes:
                continue
            codes[child.pid] = code
            if code != 0:
                log.error(
                    "a worker process failed; stopping the others",
                    extra={"event": "supervisor.child_failed", "pid": child.pid, "code": code},
                )
                _signal_all(children, signal.SIGTERM)
        time.sleep(0.05)
    return 0 if all(code == 0 for code in codes.values()) else 1


def _signal_all(children: Sequence[subprocess.Popen[bytes]], sig: int) -> None:
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)


def child_command(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "spark_outbox", "dispatcher", "run", "--processes", "1", *argv]
