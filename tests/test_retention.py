"""Retention against real PostgreSQL: finished effects are deleted with their attempts
in small batches, their keys stay known (never enqueued or sent again) until the
ledger's horizon, their markers count them, nothing else moves."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.console import operations, reconcile
from spark_outbox.core import db
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.errors import ConfigurationError, InvalidRequest, NotFound
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import retention, store
from spark_outbox.dispatch.worker import Worker
from tests.api.builders import Built, add_attempt, add_batch, add_effect
from tests.conftest import insert_billing_endpoints

THIRTY_DAYS_S = 30 * 86400.0


def _history(engine: Engine) -> dict[str, Built]:
    """Finished 40 days ago: delivered (after a retry), dead, cancelled, expired; plus a
    recent delivered one and a pending one."""
    insert_billing_endpoints(engine)
    with engine.begin() as conn:
        old = ("old-ok", "old-dead", "old-cancel", "old-expired")
        built = {name: add_effect(conn, name) for name in old}
        conn.execute(
            sa.text("UPDATE effects SET state = 'expired' WHERE idempotency_key = :k"),
            {"k": built["old-expired"].key},
        )
        add_attempt(conn, built["old-ok"], "retry", status_code=503)
        add_attempt(conn, built["old-ok"], "delivered", status_code=200)
        add_attempt(conn, built["old-dead"], "dead", status_code=400)
        operations.cancel(conn, built["old-cancel"].key, actor="olga", reason="customer left")
        conn.execute(sa.text("UPDATE effects SET updated_at = now() - interval '40 days'"))
        built["new-ok"] = add_effect(conn, "new-ok")
        add_attempt(conn, built["new-ok"], "delivered", status_code=200)
        built["pending"] = add_effect(conn, "pending")
    return built


def _rows(engine: Engine) -> dict[str, dict[str, object]]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT idempotency_key, state, payload, purged_at, "
                "(SELECT count(*) FROM delivery_attempts a WHERE a.effect_id = e.id) AS attempts "
                "FROM effects e"
            )
        ).mappings()
        return {r["idempotency_key"]: dict(r) for r in rows}


def _ledger(engine: Engine) -> dict[str, str]:
    with engine.connect() as conn:
        return dict(conn.execute(sa.text("SELECT idempotency_key, state FROM key_ledger")).all())


def test_purge_deletes_finished_effects_and_keeps_the_keys_of_every_finished_state(
    engine: Engine,
) -> None:
    built = _history(engine)
    cutoff = retention.cutoff_for(THIRTY_DAYS_S)
    assert retention.count_purgeable(engine, cutoff) == 4
    # finished: two batches; expired (a range of its own): one
    done = retention.purge(engine, cutoff, batch_size=2)
    assert (done.effects, done.attempts, done.batches) == (4, 3, 3)
    assert set(_rows(engine)) == {built["new-ok"].key, built["pending"].key}
    with engine.connect() as conn:
        left = conn.execute(sa.text("SELECT count(*) FROM delivery_attempts")).scalar_one()
    assert left == 1  # new-ok's
    assert _ledger(engine) == {
        built["old-ok"].key: "delivered",
        built["old-dead"].key: "dead",
        built["old-cancel"].key: "cancelled",
        built["old-expired"].key: "expired",
        built["new-ok"].key: "delivered",
    }
    assert retention.purge(engine, cutoff, batch_size=2).effects == 0  # nothing left


def test_a_purged_key_is_never_enqueued_requeued_or_recovered_again(engine: Engine) -> None:
    built = _history(engine)
    retention.purge(engine, retention.cutoff_for(THIRTY_DAYS_S), batch_size=100)
    for name in ("old-ok", "old-dead", "old-cancel", "old-expired"):
        with engine.begin() as conn:
            again = enqueue(
                conn, idempotency_key=built[name].key, endpoint="billing-webhook", payload={}
            )
        assert again.new is False  # the ledger alone refuses it
    assert set(_rows(engine)) == {built["new-ok"].key, built["pending"].key}
    with (
        pytest.raises(NotFound, match=r"dead-lettered on billing-webhook.*retention"),
        engine.begin() as c,
    ):
        operations.requeue(c, built["old-dead"].key, actor="olga", reason="retry")
    with engine.begin() as conn:
        since = dt.datetime.now(dt.UTC) - dt.timedelta(days=60)
        found = operations.recover_endpoint(
            conn, "billing-webhook", since=since, cap=10, dry_run=True, actor="o", reason="r"
        )
    assert found.matched == 0


def test_stubs_left_by_an_erasure_or_an_older_purge_are_deleted_too(engine: Engine) -> None:
    built = _history(engine)
    with engine.begin() as conn:  # what the purge of the previous release left
        conn.execute(
            sa.text(
                "UPDATE effects SET payload = '{}', purged_at = now() - interval '35 days'"
                " WHERE idempotency_key = :k"
            ),
            {"k": built["old-ok"].key},
        )
    cutoff = retention.cutoff_for(THIRTY_DAYS_S)
    assert retention.count_purgeable(engine, cutoff) == 4  # the stub among them
    assert retention.purge(engine, cutoff, batch_size=100).effects == 4
    assert set(_rows(engine)) == {built["new-ok"].key, built["pending"].key}


def test_the_ledger_forgets_keys_past_its_horizon_and_only_those(engine: Engine) -> None:
    built = _history(engine)
    cutoff, horizon = (retention.cutoff_for(d * 86400.0) for d in (30, 400))
    retention.purge(engine, cutoff, batch_size=100)
    with engine.begin() as conn:  # the keys finished long ago (and new-ok's too)
        conn.execute(sa.text("UPDATE key_ledger SET finished_at = now() - interval '500 days'"))
    assert retention.count_forgettable(engine, horizon) == 5  # old-expired's too
    done = retention.purge(engine, cutoff, batch_size=1, horizon=horizon)
    # new-ok's effect is still there: its key stays (its unique key guards it anyway)
    assert (done.effects, done.keys) == (0, 4)
    assert _ledger(engine) == {built["new-ok"].key: "delivered"}
    with engine.begin() as conn:
        again = enqueue(
            conn, idempotency_key=built["old-ok"].key, endpoint="billing-webhook", payload={}
        )
    assert again.new is True  # forgotten: the operator's horizon said so


def test_the_ledgers_horizon_is_refused_shorter_than_the_purges() -> None:
    with pytest.raises(InvalidRequest, match="forget keys later"):
        retention.check_horizon(30 * 86400.0, 7 * 86400.0)
    with pytest.raises(ConfigurationError, match="OUTBOX_RETENTION_OLDER_THAN too"):
        Settings.from_env(env={"OUTBOX_RETENTION_FORGET_KEYS_AFTER": "400d"})
    with pytest.raises(ConfigurationError, match="at most the same duration"):
        Settings.from_env(
            env={"OUTBOX_RETENTION_OLDER_THAN": "30d", "OUTBOX_RETENTION_FORGET_KEYS_AFTER": "7d"}
        )
    on = Settings.from_env(
        env={"OUTBOX_RETENTION_OLDER_THAN": "30d", "OUTBOX_RETENTION_FORGET_KEYS_AFTER": "400d"}
    )
    assert on.retention_forget_keys_after_s == 400 * 86400.0


def test_a_batch_marker_counts_what_retention_deleted(engine: Engine) -> None:
    insert_billing_endpoints(engine)
    with engine.begin() as conn:
        rows = [{"name": f"b{i}"} for i in range(3)]
        kept, *finished = add_batch(conn, "billing", "b-1", rows)
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'dead', updated_at = now() - interval '40 days'"
                " WHERE id = ANY(:ids)"
            ),
            {"ids": [b.id for b in finished]},
        )
    retention.purge(engine, retention.cutoff_for(THIRTY_DAYS_S), batch_size=100)
    with engine.connect() as conn:
        purged = conn.execute(sa.text("SELECT effects_purged FROM batches")).scalar_one()
        assert reconcile.batch(conn, "billing", "b-1").unexplained == 0
    assert (purged, set(_rows(engine))) == (2, {kept.key})


def test_only_delivered_ledger_rows_settle_a_claim(engine: Engine) -> None:
    """A dead or cancelled ledger row blocks enqueue; it does not mark an effect delivered."""
    insert_billing_endpoints(engine)
    keys = [effect_key("t", i) for i in range(2)]
    with engine.begin() as conn:
        for key in keys:
            enqueue(conn, idempotency_key=key, endpoint="billing-webhook", payload={"k": key})
        for key, state in zip(keys, ("delivered", "dead"), strict=True):
            conn.execute(
                sa.text(
                    "INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, state, "
                    "delivered_at) VALUES (:k, 'billing-webhook', 'x', :s, "
                    "CASE WHEN :s = 'delivered' THEN now() END)"
                ),
                {"k": key, "s": state},
            )
    (claimed,) = store.claim(engine, "w1", 10, 30)
    assert claimed.idempotency_key == keys[1]  # sent: only 'delivered' means delivered
    assert _rows(engine)[keys[0]]["state"] == "delivered"


def test_a_locked_row_is_skipped_not_waited_for(engine: Engine, db_url: str) -> None:
    built = _history(engine)
    # Any lock wait fails the purge after 2 s instead of hanging the test.
    impatient = sa.create_engine(
        db.sqlalchemy_url(db_url), connect_args={"options": "-c lock_timeout=2s"}
    )
    try:
        with engine.connect() as holder:
            tx = holder.begin()
            holder.execute(
                sa.text("SELECT 1 FROM effects WHERE idempotency_key = :k FOR UPDATE"),
                {"k": built["old-dead"].key},
            )
            cutoff = retention.cutoff_for(THIRTY_DAYS_S)
            assert retention.purge(impatient, cutoff, batch_size=100).effects == 3
            tx.rollback()
        assert retention.purge(impatient, cutoff, batch_size=100).effects == 1  # its turn now
    finally:
        impatient.dispose()


def _purges_recorded(engine: Engine) -> int:
    with engine.connect() as conn:
        found = conn.execute(
            sa.text("SELECT count(*) FROM operator_actions WHERE action = 'purge'")
        )
        return int(found.scalar_one())


def test_a_paced_purge_rests_after_each_batch_for_its_share_of_the_time(engine: Engine) -> None:
    built = _history(engine)
    rests: list[float] = []
    worked: list[float] = []

    def batch_done(done: retention.Purged) -> None:
        worked.append(done.seconds - sum(worked))

    cutoff = retention.cutoff_for(THIRTY_DAYS_S)
    done = retention.purge(
        engine, cutoff, batch_size=2, pace=0.25, sleep=rests.append, on_batch=batch_done
    )
    # The same purge as at full speed, with a rest of three times each batch's work
    # after it (a quarter of the time worked): none after the empty batch that ends a pass.
    assert (done.effects, done.batches) == (4, 3)
    assert set(_rows(engine)) == {built["new-ok"].key, built["pending"].key}
    assert len(rests) == 3 and all(r > 0 for r in rests)
    assert rests == pytest.approx([3 * w for w in worked], rel=1e-6)
    never: list[float] = []
    retention.purge(engine, cutoff, batch_size=2, sleep=never.append)
    assert never == []  # pace 1 (the default): never rests


@pytest.mark.parametrize("pace", [0.0, 1e-9, -1.0, 1.5, float("nan"), float("inf")])
def test_a_pace_outside_0_01_to_1_is_refused_naming_the_setting(pace: float) -> None:
    with pytest.raises(InvalidRequest, match=r"pace.*from 0\.01 to 1"):
        retention.check_pace(pace, "pace")
    with pytest.raises(ConfigurationError, match=r"OUTBOX_RETENTION_PACE=.*e\.g\. 0\.25"):
        Settings.from_env(env={"OUTBOX_RETENTION_PACE": repr(pace)})
    assert retention.rest_after(0.1, 1.0) == 0.0 and retention.rest_after(-1.0, 0.5) == 0.0


def test_a_dispatcher_with_retention_purges_on_its_own(engine: Engine, settings: Settings) -> None:
    built = _history(engine)
    s = dataclasses.replace(
        settings, retention_older_than_s=THIRTY_DAYS_S, poll_interval_s=0.1, worker_id="w-ret"
    )

    async def main() -> int:
        worker = Worker(s, engine, database_url=s.database_url)
        running = asyncio.create_task(worker.run())
        for _ in range(100):
            await asyncio.sleep(0.1)
            if _purges_recorded(engine):
                break
        worker.stop()
        return await running

    assert asyncio.run(main()) == 0
    assert set(_rows(engine)) == {built["new-ok"].key, built["pending"].key}
    with engine.connect() as conn:
        actor, details = conn.execute(
            sa.text("SELECT actor, details FROM operator_actions WHERE action = 'purge'")
        ).one()
    # The system's one actor, as for its other changes; the worker that ran it in details.
    assert (
        actor == "system" and details["worker_id"] == "w-ret" and details["effects"] == 4
    )  # old-expired among them


def test_retention_settings_are_read_and_checked_at_start() -> None:
    on = Settings.from_env(env={"OUTBOX_RETENTION_OLDER_THAN": "30d"})
    assert on.retention_older_than_s == THIRTY_DAYS_S and on.retention_batch_size == 1000
    assert on.retention_pace == 0.25  # the dispatcher's purge yields to its drain
    assert Settings.from_env(env={"OUTBOX_RETENTION_PACE": "1"}).retention_pace == 1.0
    assert Settings.from_env(env={}).retention_older_than_s == 0  # off by default
    with pytest.raises(ConfigurationError, match="OUTBOX_RETENTION_OLDER_THAN='soon'"):
        Settings.from_env(env={"OUTBOX_RETENTION_OLDER_THAN": "soon"})
    with pytest.raises(ConfigurationError, match="OUTBOX_RETENTION_BATCH_SIZE=0"):
        Settings.from_env(env={"OUTBOX_RETENTION_BATCH_SIZE": "0"})


def test_purge_drops_what_old_batches_recorded_of_their_result_rows(engine: Engine) -> None:
    with engine.begin() as conn:
        for batch_id, age in (("old", "40 days"), ("new", "1 day")):
            ref = conn.execute(
                sa.text(
                    "INSERT INTO batches (job, batch_id, run_id, committed_at)"
                    f" VALUES ('j', :b, gen_random_uuid(), now() - interval '{age}') RETURNING id"
                ),
                {"b": batch_id},
            ).scalar_one()
            conn.execute(
                sa.text(
                    "INSERT INTO batch_result_rows (batch_ref, key, row_sha256)"
                    " SELECT :ref, jsonb_build_object('id', g), 'x' FROM generate_series(1, 5) g"
                ),
                {"ref": ref},
            )
    retention.purge(engine, retention.cutoff_for(THIRTY_DAYS_S), batch_size=2)
    with engine.connect() as conn:
        left = conn.execute(
            sa.text(
                "SELECT b.batch_id, count(*) FROM batch_result_rows r"
                " JOIN batches b ON b.id = r.batch_ref GROUP BY 1"
            )
        ).all()
    assert [tuple(r) for r in left] == [("new", 5)]
