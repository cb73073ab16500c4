"""The safety valves (issue 13) against real Spark, PostgreSQL and a real receiver:
the volume guard holds an outsized batch; release delivers it, cancel sends nothing."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from dispatcher import holds
from dispatcher.errors import Conflict
from dispatcher.keys import effect_key
from dispatcher.settings import Settings
from spark_jobs.guard import Limits, VolumeGuard
from tests.conftest import insert_endpoint
from tests.dispatcher.conftest import Receiver, run_worker
from tests.spark.helpers import EFFECT_SCHEMA, sink, table

pytestmark = pytest.mark.spark

# Baseline after two batches; 3x the median and at least one effect holds a batch.
GUARD = VolumeGuard(Limits(factor=3, min_effects=1, min_batches=2))


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


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

    # The cancelled keys stay known: a re-run under another batch id enqueues nothing new.
    rerun = guarded.write(None, _effects(spark, 200, 30), batch_id="b4-rerun")
    assert (rerun.effects_new, rerun.effects_deduplicated, rerun.held_reason) == (0, 30, None)
    actions = table(engine, "SELECT action, target, reason FROM operator_actions ORDER BY id")
    assert actions == [
        ("release_batch", "t/b3", "real growth"),
        ("cancel_batch", "t/b4", "bad join"),
    ]
    # The guard switched off lets the same outsized batch flow.
    free = sink(db_url, volume_guard=VolumeGuard.off(), results=None)
    assert free.write(None, _effects(spark, 500, 40), batch_id="b5").held_reason is None
    assert _claimable(engine, "b5") == 40


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
    from outbox.spark_cmd import preview_text

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
