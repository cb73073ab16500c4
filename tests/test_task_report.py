"""The task report of the Spark protocol: one type for a write's and a preview's
tasks, added up by the task (its chunks) and by the driver (its tasks)."""

from __future__ import annotations

from spark_outbox.spark.protocol import EXAMPLES_KEPT, KEYS_KEPT, TaskReport


def _example(key: str) -> dict[str, object]:
    return {"idempotency_key": key, "state": "pending", "diff": {"v": ["1", "2"]}}


def test_reports_add_up_counts_and_keep_the_first_distinct_keys_and_examples() -> None:
    first = TaskReport(
        7,
        rows=3,
        mismatches=2,
        rejects=1,
        mismatch_keys=("a", "b"),
        same_by_state={"pending": 2},
        examples=(_example("a"), _example("b")),
        reject_reasons={"recipient: empty": 1},
    )
    second = TaskReport(
        8,
        rows=4,
        mismatches=5,
        deferred=1,
        mismatch_keys=("b", "c", "d", "e", "f", "g"),
        same_by_state={"pending": 1, "delivered": 3},
        examples=(_example("c"), _example("d")),
        reject_reasons={"recipient: empty": 2, "endpoint: unknown": 1},
    )
    total = first + second
    assert (total.task_id, total.rows, total.mismatches, total.deferred, total.rejects) == (
        7,
        7,
        7,
        1,
        1,
    )
    assert total.mismatch_keys == ("a", "b", "c", "d", "e")[:KEYS_KEPT]
    assert total.same_by_state == {"pending": 3, "delivered": 3}
    assert [e["idempotency_key"] for e in total.examples] == ["a", "b", "c"][:EXAMPLES_KEPT]
    assert total.reject_reasons == {"recipient: empty": 3, "endpoint: unknown": 1}
    assert sum((first, second), TaskReport()).rows == 7


def test_a_report_crosses_to_the_driver_unchanged() -> None:
    report = TaskReport(
        3,
        rows=10,
        mismatches=1,
        mismatch_keys=("k",),
        new_by_endpoint={"hook": 9},
        different_by_state={"pending": 1},
        examples=(_example("k"),),
    )
    row = report.to_batch().to_pylist()[0]
    assert TaskReport.from_row(row) == report
