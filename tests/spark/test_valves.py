"""The safety valves (issue 13) against real Spark, PostgreSQL and a real receiver:
the volume guard holds an outsized batch; release delivers it, cancel sends nothing."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.console import holds
from spark_outbox.core.errors import Conflict
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from spark_outbox.spark.guard import Limits, VolumeGuard
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker
from tests.spark.helpers import EFFECT_SCHEMA, sink, table

pytestmark = pytest.mark.spark

# Baseline after two batches; 3x the median and at least one effect holds a batch.
GUARD = VolumeGuard(Limits(factor=3, min_effects=1, min_batches=2))


def _rows(first: int, n: int, version: int = 1) -> list[tuple[Any, ...]]:
    return [
        (effect_key("valve", i), "hook", json.dumps({"n": i, "v": version}), None)
        for i in range(first, first + n)
    ]


def _effects(spark: Any, first: int, n: int, version: int = 1) -> Any:
    return spark.createDataFrame(_rows(first, n, version), EFFECT_SCHEMA)


def _claimable(engine: Engine, batch_id: str) -> int:
    rows = table(engine, f"SELECT count(*) FROM claimable_effects WHERE batch_id = '{batch_id}'")
    return int(rows[0][0])


def _states(engine: Engine, batch_id: str) -> dict[str, int]:
    sql = f"SELECT state, count(*) FROM effects WHERE batch_id = '{batch_id}' GROUP BY state"
    return {state: int(n) for state, n in table(engine, sql)}


def _deliver(settings: Settings, engine: Engine) -> None:
    fast = dataclasses.replace(
        settings, worker_id="valves", lease_s=5.0, poll_interval_s=0.1, shutdown_timeout_s=5.0
    )
    run_worker(fast, engine, idle_within_s=0.5)


def test_outsized_batch_is_held_until_released_and_a_cancelled_one_sends_nothing(
    spark: Any, db_url: str, engine: Engine, settings: Settings, receiver: Receiver
) -> None:
    insert_endpoint(engine, "hook", url=receiver.url())
    guarded = sink(db_url, volume_guard=GUARD, results=None)
    for batch_id, first in (("b1", 0), ("b2", 4)):
        assert guarded.write(None, _effects(spark, first, 4), batch_id=batch_id).held_reason is None
    held = guarded.write(None, _effects(spark, 100, 20), batch_id="b3")
    assert held.status == "committed" and held.effects_new == 20
    assert (
        held.held_reason is not None and "20 new effects, above 3x the median 4" in held.held_reason
    )
    assert (_claimable(engine, "b2"), _claimable(engine, "b3")) == (4, 0)
    _deliver(settings, engine)
    assert len(receiver.keys()) == 8  # b1 and b2 flowed; b3 waits
    assert _states(engine, "b3") == {"pending": 20}
    parked = "SELECT count(*) FROM effects WHERE batch_id = 'b3' AND next_attempt_at = 'infinity'"
    assert table(engine, parked) == [(20,)]  # beyond the claim's index range

    with engine.begin() as conn:
        [listed] = holds.held_batches(conn)
        assert (listed.batch_id, listed.pending) == ("b3", 20)
        dry = holds.release(conn, "t", "b3", actor="test", reason="checked", dry_run=True)
    assert (dry.effects, dry.dry_run, _claimable(engine, "b3")) == (20, True, 0)
    with engine.begin() as conn:
        holds.release(conn, "t", "b3", actor="test", reason="real growth", dry_run=False)
    _deliver(settings, engine)
    assert len(receiver.keys()) == 28 and _states(engine, "b3") == {"delivered": 20}

    # The released batch counts in the baseline (median of 4, 4, 20 is 4): 30 is held again.
    again = guarded.write(None, _effects(spark, 200, 30), batch_id="b4")
    assert again.held_reason is not None
    with engine.begin() as conn:
        done = holds.cancel(conn, "t", "b4", actor="test", reason="bad join", dry_run=False)
        assert done.effects == 30
        with pytest.raises(Conflict, match="cancelled; only a held batch"):
            holds.release(conn, "t", "b4", actor="test", reason="too late", dry_run=False)
    _deliver(settings, engine)
    assert len(receiver.keys()) == 28 and _states(engine, "b4") == {"cancelled": 30}

    # The cancelled keys stay known: a re-run enqueues none of them again. The guard
    # switched off lets its 40 new effects flow (held at once with the guard on).
    free = sink(db_url, volume_guard=VolumeGuard.off(), results=None)
    rerun = free.write(None, _effects(spark, 200, 70), batch_id="b4-rerun")
    assert (rerun.effects_new, rerun.effects_deduplicated, rerun.held_reason) == (40, 30, None)
    assert _claimable(engine, "b4-rerun") == 40 and _states(engine, "b4") == {"cancelled": 30}
    actions = table(
        engine, "SELECT actor, action, target, reason FROM operator_actions ORDER BY id"
    )
    # Each hold is the system's, with the guard's reason, in the commit that held it.
    assert actions == [
        ("system", "hold_batch", "t/b3", held.held_reason),
        ("test", "release_batch", "t/b3", "real growth"),
        ("system", "hold_batch", "t/b4", again.held_reason),
        ("test", "cancel_batch", "t/b4", "bad join"),
    ]


LEFT_BEHIND = (
    "SELECT (SELECT count(*) FROM batches), (SELECT count(*) FROM batch_runs), "
    "(SELECT count(*) FROM deferred_effects), (SELECT count(*) FROM staged_rejects), "
    "(SELECT count(*) FROM staged_results), (SELECT count(*) FROM rejects), "
    "(SELECT last_value FROM effects_id_seq), "
    "(SELECT string_agg(idempotency_key || state || payload::text, ',' ORDER BY id) FROM effects)"
)


def test_preview_reports_what_a_write_would_do_and_leaves_nothing_behind(
    spark: Any, db_url: str, engine: Engine
) -> None:
    from spark_outbox.cli.spark_cmd import preview_text

    insert_endpoint(engine, "hook")
    guarded = sink(db_url, volume_guard=VolumeGuard(Limits(factor=3, min_effects=1, min_batches=1)))
    guarded.write(None, _effects(spark, 0, 10), batch_id="b1")
    before = table(engine, LEFT_BEHIND)
    rows = [
        *_rows(0, 5),  # stored, same payload
        *_rows(5, 3, version=2),  # stored, another payload
        *_rows(20, 40),  # new
        *_rows(20, 1),  # a twin of a new key
        (effect_key("valve", 90), "nope", "{}", None),  # unknown endpoint
        ("not-a-key", "hook", "{}", None),
    ]
    preview = guarded.preview(None, spark.createDataFrame(rows, EFFECT_SCHEMA), batch_id="b1")
    assert table(engine, LEFT_BEHIND) == before  # no row, no marker, no run, no id drawn
    assert preview.committed_before is True
    assert (preview.effects_total, preview.effects_new, preview.new_by_endpoint) == (
        49,
        40,
        {"hook": 40},
    )
    assert (preview.same_payload, preview.different_payload) == ({"pending": 5}, {"pending": 3})
    assert len(preview.examples) == 3
    assert all(ex["diff"] == {"v": ["1", "2"]} for ex in preview.examples)
    assert preview.rejects == 2 and any(
        "no endpoint named 'nope'" in r for r in preview.reject_reasons
    )
    assert preview.would_hold is not None and "40 new effects, above 3x the median 10" in (
        preview.would_hold
    )
    text = preview_text(dataclasses.asdict(preview))
    assert "dry run, nothing written (committed before" in text
    assert "stored with another payload: 3 (pending: 3)" in text
    assert "volume guard: HELD: hook: 40 new effects" in text


INVOICE_EFFECTS = "invoice_id string, revision int, amount long"


def _invoice_effects(spark: Any, rows: list[tuple[Any, ...]]) -> Any:
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column, supersedes_column

    df = spark.createDataFrame(rows, INVOICE_EFFECTS)
    identity = ("invoice.issued", df.schema, "invoice_id")
    return df.select(
        effect_key_column(*identity, revision="revision").alias("idempotency_key"),
        supersedes_column(*identity, revision="revision").alias("supersedes"),
        F.lit("hook").alias("endpoint"),
        F.to_json(F.struct("invoice_id", "amount")).alias("payload"),
        F.col("invoice_id").alias("reference"),
    )


def test_a_correction_is_a_new_key_linked_both_ways_and_a_changed_rerun_is_surfaced(
    spark: Any, db_url: str, engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    from spark_outbox.console import audit, health
    from spark_outbox.core.keys import superseded_key

    insert_endpoint(engine, "hook")
    plain = sink(db_url, results=None)
    plain.write(None, _invoice_effects(spark, [("A", 1, 10), ("B", None, 20)]), batch_id="d1")
    a1, b1 = effect_key("invoice.issued", "A"), effect_key("invoice.issued", "B")
    assert {r[0] for r in table(engine, "SELECT idempotency_key FROM effects")} == {a1, b1}

    # A re-run that computed another amount for B: counted, logged by key, on the status.
    with caplog.at_level("WARNING", logger="spark_outbox.spark.notices"):
        rerun = plain.write(None, _invoice_effects(spark, [("B", 1, 25)]), batch_id="d1-rerun")
    assert (rerun.effects_new, rerun.payload_mismatches) == (0, 1)
    warned = [r for r in caplog.records if getattr(r, "event", "") == "batch.payload_mismatch"]
    assert [r.idempotency_key for r in warned] == [b1]  # type: ignore[attr-defined]
    assert "25" not in caplog.text  # the key only, never the payload
    with engine.connect() as conn:
        status = health.status(conn)
        assert [(m.batch_id, m.payload_mismatches) for m in status.payload_mismatches] == [
            ("d1-rerun", 1)
        ]
        assert health.queue_gauges(conn).mismatches_24h == 1

    # The supported path: revision 2 of B, a new key that names the one it supersedes.
    fixed = plain.write(None, _invoice_effects(spark, [("B", 2, 25), ("C", 0, 5)]), batch_id="d2")
    b2 = effect_key("invoice.issued", "B", revision=2)
    assert (fixed.effects_new, fixed.rejects) == (1, 1)  # revision 0 names no key: a reject
    assert superseded_key("invoice.issued", "B", revision=2) == b1
    with engine.connect() as conn:
        assert audit.effect_detail(conn, b1).superseded_by == [b2]
        later = audit.effect_detail(conn, b2)
    assert (later.effect.supersedes, later.effect.payload) == (
        b1,
        {"invoice_id": "B", "amount": 25},
    )
