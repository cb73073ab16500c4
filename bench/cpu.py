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
import threading
from pathlib import Path

from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core.settings import Settings

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


def _stat(pid: int) -> float:
    """utime + stime of ``pid``, in seconds; 0 when it is gone."""
    return _times(pid)[0]


def _times(pid: int) -> tuple[float, float]:
    """(utime + stime, its reaped children's) of ``pid`` in seconds; 0s when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    own = int(fields[11]) + int(fields[12])
    return own / _TICK, (int(fields[13]) + int(fields[14])) / _TICK


def postmaster_pid() -> int | None:
    if Settings.from_env().database_url:
        return None
    pid_file = PrivateCluster(Settings.from_env().state_dir).data_dir / "postmaster.pid"
    try:
        return int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _postgres(postmaster: int | None) -> float | None:
    """The postmaster's own and reaped backends' CPU, plus its live backends'.

    A backend reaped between reading the reaped total and listing the live ones
    would be in neither (a run's backends exit right as its clock stops: one
    sink row once showed 8.2 CPU-s where its rounds before had 22): the snapshot
    is taken again until no backend was reaped while it was taken."""
    if postmaster is None:
        return None
    for _ in range(20):
        own, reaped = _times(postmaster)
        try:
            live = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
        except OSError:
            return None
        total = own + reaped + sum(_stat(int(pid)) for pid in live)
        if _times(postmaster)[1] == reaped:
            break
    return total


class TreeMeter:
    """CPU seconds of a process and every descendant, counted process by process.

    A Spark driver's JVM, its Python workers and a standalone cluster's master,
    workers and executors all hang below the bench process. Summing the live tree
    at two instants is wrong where a process exits in between: PySpark's daemon
    ignores SIGCHLD, so an idle Python worker that exits takes its CPU with it (the
    raw-COPY rows once read negative). Here every process, told apart by pid and
    start time, is sampled every ``interval_s`` while the meter runs and counts
    the CPU it used since the meter started (since it started, if later), up to
    its last sample: at most ``interval_s`` of a process that exits is lost.
    """

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self._root = root
        self._interval_s = interval_s
        self._first: dict[tuple[int, str], float] = {}
        self._last: dict[tuple[int, str], float] = {}
        self._stopping = threading.Event()
        self._sample(at_start=True)
        self._thread = threading.Thread(target=self._run, name="cpu-tree-meter", daemon=True)
        self._thread.start()

    def stop(self) -> float:
        """The CPU seconds the tree used since the meter started."""
        self._stopping.set()
        self._thread.join()
        self._sample(at_start=False)
        return sum(last - self._first.get(key, 0.0) for key, last in self._last.items())

    def _run(self) -> None:
        while not self._stopping.wait(self._interval_s):
            self._sample(at_start=False)

    def _sample(self, *, at_start: bool) -> None:
        for pid in _tree(self._root):
            seen = _own(pid)
            if seen is None:
                continue
            key, seconds = seen
            if at_start:
                self._first[key] = seconds
            self._last[key] = max(seconds, self._last.get(key, 0.0))


def _own(pid: int) -> tuple[tuple[int, str], float] | None:
    """((pid, start time), utime + stime in seconds) of a live process, else None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (pid, fields[19]), (int(fields[11]) + int(fields[12])) / _TICK


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a JVM forks from any of its threads)."""
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += (task / "children").read_text().split()
        except OSError:
            continue
    return [pid, *(p for child in children for p in _tree(int(child)))]


def postgres_seconds(postmaster: int | None) -> float | None:
    """CPU seconds of the private cluster so far (None when DATABASE_URL points elsewhere)."""
    return _postgres(postmaster)


def sample(receiver_pid: int, postmaster: int | None) -> Sample:
    t = os.times()
    return Sample(t.children_user + t.children_system, _postgres(postmaster), _stat(receiver_pid))
