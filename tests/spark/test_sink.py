"""The sink against real Spark (local[2]) and real PostgreSQL."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.spark import phases
from spark_outbox.spark.outcome import InvalidRows
from tests.conftest import insert_endpoint
from tests.spark.helpers import (
    EFFECT_SCHEMA,
    EFFECTS_SNAPSHOT,
    INVOICE_SCHEMA,
    INVOICES_SNAPSHOT,
    effect_rows,
    invoice_rows,
    marker,
    numbers_query,
    sink,
    table,
)

pytestmark = pytest.mark.spark


@pytest.fixture
def hook(engine: Engine) -> Engine:
    insert_endpoint(engine, "hook")
    return engine


def _frames(spark: Any, effects: list[Any], invoices: list[Any]) -> tuple[Any, Any]:
    return (
        spark.createDataFrame(invoices, INVOICE_SCHEMA),
        spark.createDataFrame(effects, EFFECT_SCHEMA),
    )


def test_batch_commits_results_effects_and_counts(spark: Any, db_url: str, hook: Engine) -> None:
    results, effects = _frames(spark, effect_rows(30), invoice_rows(5))
    outcome = sink(db_url).write(results, effects, batch_id="b1")
    assert (outcome.status, outcome.effects_new, outcome.result_rows) == ("committed", 30, 5)
    assert len(table(hook, EFFECTS_SNAPSHOT)) == 30
    assert {r[1:3] for r in table(hook, EFFECTS_SNAPSHOT)} == {("t", "b1")}
    assert marker(hook, "b1")["effects_new"] == 30
    assert _leftovers(hook) == (0, 0, 0, 0)


def _leftovers(engine: Engine) -> tuple[int, ...]:
    """Staged rejects and results, deferred effects, runs: none once a batch is done."""
    counts = table(
        engine,
        "SELECT (SELECT count(*) FROM staged_rejects), (SELECT count(*) FROM staged_results), "
        "(SELECT count(*) FROM deferred_effects), (SELECT count(*) FROM batch_runs)",
    )
    return tuple(counts[0])


def test_replayed_batch_enqueues_nothing_and_changes_no_result(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results, effects = _frames(spark, effect_rows(10), invoice_rows(3))
    sink(db_url).write(results, effects, batch_id="b1")
    before = (table(hook, EFFECTS_SNAPSHOT), table(hook, INVOICES_SNAPSHOT), marker(hook, "b1"))
    changed, more = _frames(spark, effect_rows(12, version=2), invoice_rows(4))
    outcome = sink(db_url).write(changed, more, batch_id="b1")
    assert (outcome.status, outcome.effects_new, outcome.run_id) == ("replayed", 0, None)
    assert outcome.original is not None
    assert (outcome.original.effects_new, outcome.original.result_rows) == (10, 3)
    after = (table(hook, EFFECTS_SNAPSHOT), table(hook, INVOICES_SNAPSHOT), marker(hook, "b1"))
    assert after == before


def test_small_chunks_and_one_chunk_give_the_same_result(
    spark: Any, db_url: str, hook: Engine, second_db: tuple[str, Engine]
) -> None:
    other_url, other = second_db
    insert_endpoint(other, "hook")
    rows = [*effect_rows(20), ("bad", "hook", "{}", None), (effect_key("x"), "nope", "{}", None)]
    rows += effect_rows(3)  # twins in the batch: deduplicated, counted
    results, effects = _frames(spark, rows, invoice_rows(6))
    a = sink(db_url, chunk_rows=3).write(results, effects, batch_id="b1")
    b = sink(other_url).write(results, effects, batch_id="b1")
    assert (a.effects_total, a.effects_new, a.effects_deduplicated, a.rejects) == (23, 20, 3, 2)
    assert a.payload_mismatches == 0
    strip = ("run_id",)
    assert {k: v for k, v in vars(a).items() if k not in strip} == {
        k: v for k, v in vars(b).items() if k not in strip
    }
    for query in (
        EFFECTS_SNAPSHOT,
        INVOICES_SNAPSHOT,
        "SELECT reason, raw_row FROM rejects ORDER BY 1",
    ):
        assert table(hook, query) == table(other, query)


def test_invalid_rows_land_in_rejects_and_every_valid_row_commits(
    spark: Any, db_url: str, hook: Engine
) -> None:
    bad = [
        ("not-a-key", "hook", '{"a": 1}', None),
        (effect_key("k", 1), None, '{"a": 1}', None),
        (effect_key("k", 2), "no-such-endpoint", '{"a": 1}', None),
        (effect_key("k", 3), "hook", "{not json", None),
        (effect_key("k", 4), "hook", "[1, 2]", None),
        (effect_key("k", 5), "hook", '{"a": "\\u0000"}', None),
        (effect_key("k", 6), "hook", None, None),
    ]
    results, effects = _frames(spark, [*effect_rows(8), *bad], invoice_rows(2))
    outcome = sink(db_url).write(results, effects, batch_id="b1")
    assert (outcome.effects_new, outcome.rejects) == (8, 7)
    reasons = [r[0] for r in table(hook, "SELECT reason FROM rejects ORDER BY reason")]
    assert [r.split(":")[0] for r in reasons] == [
        "endpoint",
        "endpoint",
        "idempotency_key",
        "payload",
        "payload",
        "payload",
        "payload",
    ]
    assert any("no-such-endpoint" in r for r in reasons)
    raw = table(hook, "SELECT raw_row->>'idempotency_key' FROM rejects ORDER BY 1")
    assert ("not-a-key",) in raw
    assert marker(hook, "b1")["rejects"] == 7


def test_on_invalid_fail_aborts_the_batch_listing_reasons(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results, effects = _frames(spark, [*effect_rows(3), ("bad", "hook", "{}", None)], [])
    with pytest.raises(InvalidRows, match="idempotency_key: 'bad' is not 64"):
        sink(db_url, on_invalid="fail").write(results, effects, batch_id="b1")
    # the valid rows the executors wrote were never visible, and are swept at once
    assert table(hook, "SELECT count(*) FROM effects")[0][0] == 0
    assert table(hook, "SELECT count(*) FROM batches")[0][0] == 0
    assert _leftovers(hook) == (0, 0, 0, 0)


def test_rerun_with_changed_input_counts_payload_mismatches(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results, effects = _frames(spark, effect_rows(10), invoice_rows(2))
    sink(db_url).write(results, effects, batch_id="run-1")
    changed = [*effect_rows(7), *effect_rows(10, version=2)[7:]]
    results, effects = _frames(spark, changed, invoice_rows(2))
    outcome = sink(db_url).write(results, effects, batch_id="run-2")
    assert (outcome.effects_new, outcome.effects_deduplicated) == (0, 10)
    assert outcome.payload_mismatches == 3
    assert marker(hook, "run-2")["payload_mismatches"] == 3


def test_key_enqueued_by_enqueue_is_no_mismatch_for_the_same_payload(
    spark: Any, db_url: str, hook: Engine
) -> None:
    key = effect_key("order.created", 7)
    with hook.begin() as conn:
        enqueue(conn, idempotency_key=key, endpoint="hook", payload={"b": [1, 2.5, "é"], "a": None})
    text = '{ "a" : null, "b": [1, 2.5, "\\u00e9"] }'  # same object, other spelling
    _, effects = _frames(spark, [(key, "hook", text, None)], [])
    outcome = sink(db_url, results=None).write(None, effects, batch_id="b1")
    assert (outcome.effects_deduplicated, outcome.payload_mismatches) == (1, 0)


def test_add_mode_adds_to_stored_values(spark: Any, db_url: str, hook: Engine) -> None:
    from spark_outbox.spark.results import ResultsSpec

    spec = ResultsSpec("invoices", ("invoice_id",), "add", ("amount", "units", "event_count"))
    for batch in ("b1", "b2"):
        results, effects = _frames(spark, [], invoice_rows(3))
        sink(db_url, results=spec).write(results, effects, batch_id=batch)
    assert table(hook, "SELECT units, event_count FROM invoices ORDER BY invoice_id") == [
        (0, 2),
        (2, 2),
        (4, 2),
    ]


def test_two_racing_attempts_of_one_batch_commit_exactly_once(
    spark: Any, db_url: str, hook: Engine
) -> None:
    results, effects = _frames(spark, effect_rows(25), invoice_rows(4))
    outcomes: dict[str, Any] = {}
    rival = threading.Thread(
        target=lambda: outcomes.__setitem__(
            "b", sink(db_url).write(results, effects, batch_id="b1")
        )
    )

    def start_rival_then_commit() -> None:  # A holds its uncommitted marker meanwhile
        remove()
        rival.start()
        rival.join(timeout=8)  # B stages, then blocks on A's marker row

    remove = phases.on("before_commit", start_rival_then_commit)
    outcomes["a"] = sink(db_url).write(results, effects, batch_id="b1")
    rival.join(timeout=60)
    assert (outcomes["a"].status, outcomes["b"].status) == ("committed", "lost_race")
    assert table(hook, "SELECT count(*) FROM effects")[0][0] == 25
    assert marker(hook, "b1")["run_id"].hex == outcomes["a"].run_id.replace("-", "")
    assert marker(hook, "b1")["effects_new"] == 25
    assert _leftovers(hook) == (0, 0, 0, 0)


def test_lost_commit_acknowledgement_is_resolved_by_the_marker(
    spark: Any, db_url: str, hook: Engine
) -> None:
    import psycopg2

    def lose_the_ack() -> None:
        raise psycopg2.OperationalError("server closed the connection unexpectedly")

    results, effects = _frames(spark, effect_rows(5), invoice_rows(2))
    remove = phases.on("after_commit", lose_the_ack)
    try:
        outcome = sink(db_url).write(results, effects, batch_id="b1")
    finally:
        remove()
    assert (outcome.status, outcome.resolved_by_marker, outcome.effects_new) == (
        "committed",
        True,
        5,
    )
    assert table(hook, "SELECT count(*) FROM effects")[0][0] == 5


def test_connection_killed_before_commit_is_retried_only_after_the_marker_says_so(
    spark: Any, db_url: str, hook: Engine
) -> None:
    kills = []

    def terminate_commit_backend() -> None:
        with hook.connect() as conn:
            pids = conn.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'spark-outbox-commit' "
                    "AND state = 'idle in transaction'"
                )
            ).all()
        kills.append(len(pids))

    results, effects = _frames(spark, effect_rows(6), invoice_rows(2))
    remove = phases.on("before_commit", lambda: None if kills else terminate_commit_backend())
    try:
        outcome = sink(db_url).write(results, effects, batch_id="b1")
    finally:
        remove()
    assert kills == [1]
    assert (outcome.status, outcome.effects_new, outcome.result_rows) == ("committed", 6, 2)
    assert table(hook, "SELECT count(*) FROM effects")[0][0] == 6


def test_abandoned_runs_are_swept_with_their_effect_rows(
    spark: Any, db_url: str, hook: Engine
) -> None:
    dead = "00000000-0000-0000-0000-000000000001"
    with hook.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO batch_runs (run_id, job, batch_id, started_at) "
                "VALUES (:r, 't', 'old', now() - interval '2 hours');"
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload, "
                "payload_sha256) VALUES (:k, 't', 'old', :r, 'hook', '{}', 'x');"
                "INSERT INTO staged_rejects VALUES (:r, 1, 'why', '{}');"
                "INSERT INTO deferred_effects (run_id, task_id, idempotency_key, endpoint, "
                "payload, payload_sha256) VALUES (:r, 1, :k, 'hook', '{}', 'x')"
            ),
            {"r": dead, "k": effect_key("dead", 1)},
        )
    results, effects = _frames(spark, effect_rows(1), [])
    sink(db_url).write(results, effects, batch_id="b1")
    assert table(hook, "SELECT batch_id FROM effects") == [("b1",)]
    assert _leftovers(hook) == (0, 0, 0, 0)


def test_foreach_batch_commits_each_micro_batch_under_the_query_id(
    spark: Any, db_url: str, hook: Engine, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for part in range(2):
        numbers = range(part * 10, part * 10 + 10)
        (source / f"part{part}.json").write_text("\n".join(json.dumps({"n": n}) for n in numbers))
    query = numbers_query(spark, source, tmp_path / "checkpoint", sink(db_url, results=None))
    assert query.awaitTermination(180)
    assert query.exception() is None
    keys = {r[0] for r in table(hook, "SELECT idempotency_key FROM effects")}
    assert keys == {effect_key("t.stream", n) for n in range(20)}
    assert table(hook, "SELECT batch_id, effects_new FROM batches ORDER BY batch_id") == [
        (f"{query.id}/0", 10),
        (f"{query.id}/1", 10),
    ]
