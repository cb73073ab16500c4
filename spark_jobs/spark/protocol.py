"""What the driver and the Spark tasks of a batch write exchange (docs/design.md).

1. The driver registers a run and sends every task its ``RunTag``: where to
   write, and as which job, batch and run.
2. Every task writes its partition (spark_outbox.spark.executor, spark_outbox.spark.chunks) and
   returns one ``TaskReport``, one row of ``REPORT_SCHEMA``.
3. The driver keeps the reports of the tasks Spark saw succeed (``collect``
   returns nothing else) and commits with them (spark_outbox.spark.commit).

Executors import this module: it needs nothing but the standard library (and
pyarrow, inside ``to_batch``); an import-linter contract keeps it so.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

# Mismatched keys a report carries for the log, and examples a preview shows.
KEYS_KEPT = 5
EXAMPLES_KEPT = 3


@dataclasses.dataclass(frozen=True)
class RunTag:
    """What every task of a run needs: where to write, and as whom."""

    dsn: str
    job: str
    batch_id: str
    run_id: str
    endpoints: Mapping[str, str]  # registered endpoint name -> kind, read once per batch


@dataclasses.dataclass(frozen=True)
class TaskReport:
    """What one task reports, from a write or a preview. Reports add up (``+``): a
    task adds its chunks', the driver adds its tasks' (then ``task_id`` is the first's)."""

    task_id: int = 0  # a write task's Spark attempt: the driver finds its staged rows by it
    rows: int = 0  # valid effect rows (result rows for a results task)
    mismatches: int = 0  # stored keys met with another payload
    deferred: int = 0  # keys another run without a marker held (a write's)
    rejects: int = 0  # rows that broke the effect contract
    mismatch_keys: tuple[str, ...] = ()  # a few of the mismatched keys, for the log
    # What a preview compares, a write leaves empty: keys nothing stored holds (by
    # endpoint), stored keys with the same and with another payload (by state), a
    # few of the latter with their diff, the rejects by reason.
    new_by_endpoint: Mapping[str, int] = dataclasses.field(default_factory=dict)
    same_by_state: Mapping[str, int] = dataclasses.field(default_factory=dict)
    different_by_state: Mapping[str, int] = dataclasses.field(default_factory=dict)
    examples: tuple[Mapping[str, Any], ...] = ()
    reject_reasons: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # When the task started and ended (epoch seconds, its executor's clock): the
    # driver draws the task's span from them when tracing is on (spark.spans).
    started_at: float = 0.0
    ended_at: float = 0.0

    def __add__(self, other: TaskReport) -> TaskReport:
        return TaskReport(
            task_id=self.task_id,
            rows=self.rows + other.rows,
            mismatches=self.mismatches + other.mismatches,
            deferred=self.deferred + other.deferred,
            rejects=self.rejects + other.rejects,
            mismatch_keys=first_keys(self.mismatch_keys + other.mismatch_keys),
            new_by_endpoint=_added(self.new_by_endpoint, other.new_by_endpoint),
            same_by_state=_added(self.same_by_state, other.same_by_state),
            different_by_state=_added(self.different_by_state, other.different_by_state),
            examples=(self.examples + other.examples)[:EXAMPLES_KEPT],
            reject_reasons=_added(self.reject_reasons, other.reject_reasons),
            started_at=min((t for t in (self.started_at, other.started_at) if t), default=0.0),
            ended_at=max(self.ended_at, other.ended_at),
        )

    def to_batch(self) -> Any:
        """The report as the one Arrow row (``REPORT_SCHEMA``) a task yields."""
        import pyarrow as pa

        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return pa.RecordBatch.from_pydict({"report": [json.dumps(fields)]})

    @classmethod
    def from_row(cls, row: Any) -> TaskReport:
        """The report from the Spark row ``collect`` returned."""
        fields = json.loads(row["report"])
        return cls(
            **{
                **fields,
                "mismatch_keys": tuple(fields["mismatch_keys"]),
                "examples": tuple(fields["examples"]),
            }
        )


def first_keys(keys: Iterable[str]) -> tuple[str, ...]:
    """The first ``KEYS_KEPT`` distinct keys, in order."""
    return tuple(dict.fromkeys(keys))[:KEYS_KEPT]


def _added(a: Mapping[str, int], b: Mapping[str, int]) -> Mapping[str, int]:
    return dict(Counter(a) + Counter(b))


# Each task's report is one row of one JSON column: the driver alone reads it.
REPORT_SCHEMA = "report string"
