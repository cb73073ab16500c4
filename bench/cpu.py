"""CPU seconds spent by each side of a run: the contender's processes, PostgreSQL,
the receiver. Read from /proc (Linux), so a loaded machine changes the wall
clock far more than these: they say where the work goes.

- contender: the bench process's reaped children (``os.times()``), which are
  the contender's processes (each waited for before the next sample);
- PostgreSQL: the private cluster's postmaster with its reaped backends, plus
  its live backends (unknown, ``None``, when DATABASE_URL points elsewhere);
- receiver: the receiver process.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from dispatcher.settings import Settings
from outbox.tools.pgcluster import PrivateCluster

_TICK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Sample:
    contender: float
    postgres: float | None
    receiver: float

    def __sub__(self, other: Sample) -> Sample:
        pg = None
        if self.postgres is not None and other.postgres is not None:
            pg = self.postgres - other.postgres
        return Sample(self.contender - other.contender, pg, self.receiver - other.receiver)


def _stat(pid: int, children: bool = False) -> float:
    """utime + stime (+ reaped children's) of ``pid``, in seconds; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def postmaster_pid() -> int | None:
    if Settings.from_env().database_url:
        return None
    pid_file = PrivateCluster(Settings.from_env().state_dir).data_dir / "postmaster.pid"
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _postgres(postmaster: int | None) -> float | None:
    if postmaster is None:
        return None
    try:
        live = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    except OSError:
        return None
    return _stat(postmaster, children=True) + sum(_stat(int(pid)) for pid in live)


def process_tree(pid: int) -> float:
    """CPU seconds of ``pid`` and every live descendant, each with its reaped
    children: a Spark driver's JVM, its Python workers, a standalone cluster's
    master, workers and executors all hang below the bench process."""
    total = _stat(pid, children=True)
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # a JVM forks from any of its threads
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    return total + sum(process_tree(int(child)) for child in children)


def postgres_seconds(postmaster: int | None) -> float | None:
    """CPU seconds of the private cluster so far (None when DATABASE_URL points elsewhere)."""
    return _postgres(postmaster)


def sample(receiver_pid: int, postmaster: int | None) -> Sample:
    t = os.times()
    return Sample(t.children_user + t.children_system, _postgres(postmaster), _stat(receiver_pid))
