"""The real CLI as separate processes: many workers, kill -9, a zombie, SIGTERM.

These prove the properties a single process cannot: leases keep concurrent
workers apart, a crash loses nothing, a paused worker cannot overwrite a newer
outcome, and a shutdown hands back what it did not send.
"""

from __future__ import annotations

import collections
import signal
import time
import urllib.request
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_webhook
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply
from tests.invariants import assert_invariants

pytestmark = pytest.mark.slow


def _hook(engine: Engine, url: str, **kw: object) -> str:
    with engine.begin() as conn:
        _, secret = add_webhook(conn, name="hook", url=url, **kw)  # type: ignore[arg-type]
    return secret


def _attempts(engine: Engine) -> list[dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT * FROM delivery_attempts ORDER BY id")).mappings()
        return [dict(r) for r in rows]


def test_four_workers_deliver_every_key_exactly_once(
    engine: Engine, db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    _hook(engine, receiver.url())
    keys = procs.enqueue_many(engine, 5000)
    env = procs.worker_env(db_url)
    workers = [
        procs.start(
            env | {"OUTBOX_WORKER_ID": f"w{i}"},
            "--until-idle",
            "--concurrency",
            "32",
            log=tmp_path / f"w{i}.log",
        )
        for i in range(4)
    ]
    codes = [w.wait(120) for w in workers]
    assert codes == [0, 0, 0, 0], [(tmp_path / f"w{i}.log").read_text()[-2000:] for i in range(4)]
    seen = collections.Counter(receiver.keys())
    assert set(seen) == set(keys)
    # No effect was ever held by two live leases at once: nobody sent a key twice.
    assert max(seen.values()) == 1
    assert procs.states(engine) == {"delivered": 5000}
    attempts = _attempts(engine)
    assert len(attempts) == 5000 and {a["outcome"] for a in attempts} == {"delivered"}
    # The work was shared (on a loaded machine the last workers may start after the
    # first ones took every claim, so not necessarily by all four).
    assert len({a["worker_id"] for a in attempts}) >= 2
    assert_invariants(engine)


def test_kill_9_mid_send_is_delivered_later_with_the_same_webhook_id(
    engine: Engine, db_url: str, receiver: Receiver
) -> None:
    receiver.script("/hook", Reply(200, delay_s=5.0), 200)
    _hook(engine, receiver.url())
    (key,) = procs.enqueue_many(engine, 1)
    env = procs.worker_env(db_url, OUTBOX_LEASE_S="1.5")
    victim = procs.start(env | {"OUTBOX_WORKER_ID": "victim"})
    procs.wait_for(lambda: len(receiver.seen()) == 1, 20, "the first send")
    victim.kill()
    victim.wait(10)
    time.sleep(1.6)  # the victim's lease expires
    rescuer = procs.start(env | {"OUTBOX_WORKER_ID": "rescuer"}, "--until-idle")
    assert rescuer.wait(30) == 0
    assert receiver.keys() == [key, key]  # the same webhook-id both times
    assert procs.states(engine) == {"delivered": 1}
    (attempt,) = _attempts(engine)  # the victim never recorded its attempt
    assert attempt["worker_id"] == "rescuer" and attempt["attempt"] == 2
    assert_invariants(engine)


def test_a_zombie_worker_cannot_record_an_outcome(
    engine: Engine, db_url: str, receiver: Receiver
) -> None:
    # The zombie's request gets a 400 (it would record 'dead'); the newer one a 200.
    receiver.script("/hook", Reply(400, delay_s=1.0), 200)
    _hook(engine, receiver.url())
    (key,) = procs.enqueue_many(engine, 1)
    env = procs.worker_env(db_url, OUTBOX_LEASE_S="1")
    zombie = procs.start(env | {"OUTBOX_WORKER_ID": "zombie"})
    try:
        procs.wait_for(lambda: len(receiver.seen()) == 1, 20, "the zombie's send")
        zombie.send_signal(signal.SIGSTOP)
        time.sleep(1.5)  # past its lease, and the 400 is waiting in its socket
        fresh = procs.start(env | {"OUTBOX_WORKER_ID": "fresh"}, "--until-idle")
        assert fresh.wait(30) == 0
        zombie.send_signal(signal.SIGCONT)
        procs.wait_for(lambda: len(_attempts(engine)) == 2, 20, "the zombie's late record")
    finally:
        zombie.send_signal(signal.SIGCONT)
        assert procs.stop(zombie) == 0
    outcomes = {a["worker_id"]: a["outcome"] for a in _attempts(engine)}
    assert outcomes == {"fresh": "delivered", "zombie": "stale"}
    with engine.connect() as conn:
        state, last_error = conn.execute(
            sa.text("SELECT state, last_error FROM effects WHERE idempotency_key = :k"),
            {"k": key},
        ).one()
    assert state == "delivered" and last_error is None
    assert_invariants(engine)


def test_sigterm_finishes_in_flight_hands_back_the_rest_and_exits_0(
    engine: Engine, db_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    receiver.script("/hook", Reply(200, delay_s=1.0))
    # One send at a time, each taking a second: the worker claims 4, starts 1, the
    # other 3 wait their turn.
    _hook(engine, receiver.url())
    procs.enqueue_many(engine, 4)
    env = procs.worker_env(db_url)
    port = free_port()
    worker = procs.start(
        env | {"OUTBOX_WORKER_ID": "w"},
        *("--concurrency", "1", "--claim-batch-size", "4", "--json", "--metrics-port", str(port)),
        log=tmp_path / "w.log",
    )
    procs.wait_for(lambda: len(receiver.seen()) == 1, 20, "the first send")
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        exposed = resp.read().decode()
    assert "outbox_in_flight 4.0" in exposed and "outbox_attempt_seconds" in exposed
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(20) == 0, (tmp_path / "w.log").read_text()
    assert '"delivered": 1' in (tmp_path / "w.log").read_text()
    assert procs.states(engine) == {"delivered": 1, "pending": 3}
    with engine.connect() as conn:
        leased = conn.execute(
            sa.text(
                "SELECT count(*) FROM effects WHERE lease_token IS NOT NULL OR (attempt_count > 0"
                " AND state = 'pending')"
            )
        ).scalar()
        stopped = conn.execute(
            sa.text("SELECT stopped_at IS NOT NULL FROM worker_heartbeats WHERE worker_id = 'w'")
        ).scalar()
    assert leased == 0 and stopped is True
