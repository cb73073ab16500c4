"""``outbox dispatcher run --processes N``: one supervisor, N workers, clean SIGTERM
for all, a failed child stops the rest and the supervisor exits non-zero."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.endpoints import add_webhook
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver

pytestmark = pytest.mark.slow


def _live_workers(engine: Engine) -> list[tuple[str, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT worker_id, pid FROM worker_heartbeats WHERE stopped_at IS NULL")
        )
        return [(r[0], r[1]) for r in rows]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_processes_share_the_work_and_sigterm_stops_both_cleanly(
    engine: Engine, db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
    env = procs.worker_env(db_url, OUTBOX_WORKER_ID="sup")
    sup = procs.start(env, "--processes", "2", log=tmp_path / "sup.log")
    procs.wait_for(lambda: len(_live_workers(engine)) == 2, 30, "two workers")
    keys = procs.enqueue_many(engine, 400)
    procs.wait_for(lambda: procs.states(engine) == {"delivered": 400}, 30, "the drain")
    assert sorted(w for w, _ in _live_workers(engine)) == ["sup-0", "sup-1"]
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(30) == 0, (tmp_path / "sup.log").read_text()[-2000:]
    assert _live_workers(engine) == []  # both marked stopped: each shut down cleanly
    assert sorted(receiver.keys()) == sorted(keys)


def test_a_crashed_worker_stops_the_others_and_the_supervisor_exits_non_zero(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    sup = procs.start(procs.worker_env(db_url), "--processes", "2", log=tmp_path / "sup.log")
    procs.wait_for(lambda: len(_live_workers(engine)) == 2, 30, "two workers")
    (_, victim), (_, other) = _live_workers(engine)
    os.kill(victim, signal.SIGKILL)
    assert sup.wait(30) == 1
    procs.wait_for(lambda: not _alive(other), 10, "the other worker to stop")


def test_kill_9_of_the_supervisor_takes_its_workers_with_it(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    sup = procs.start(procs.worker_env(db_url), "--processes", "2", log=tmp_path / "sup.log")
    procs.wait_for(lambda: len(_live_workers(engine)) == 2, 30, "two workers")
    pids = [pid for _, pid in _live_workers(engine)]
    sup.kill()
    sup.wait(10)
    procs.wait_for(lambda: not any(_alive(p) for p in pids), 10, "the workers to die")
