"""The invariants of the outbox, checked while it runs (``outbox verify``).

Each check is a query of verify.sql that returns the rows breaking one
invariant; a healthy outbox returns none. Two kinds:

- **state** checks read what is true now, through small partial indexes (leases,
  held batches, runs in flight): every pass reads them whole;
- **range** checks read rows past a watermark this checker keeps (effects by id,
  finished effects by (updated_at, id), markers by id), at most ``chunk`` rows a
  pass: the first passes walk the history once, later ones read only what is new.

A violation found by a range check stays counted for the checker's life (the rows
do not come round again); a state check's count is what its latest pass saw.
Nothing here writes: the checker can run beside the dispatchers with any role
that may read the tables.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "verify.sql")

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    kind: str  # "state" or "range"
    invariant: str


CHECKS = {
    c.name: c
    for c in (
        Check(
            "effect_without_marker",
            "range",
            "every Spark effect row has its marker or a run in flight",
        ),
        Check("sent_before_commit", "state", "no effect of an uncommitted run was claimed or sent"),
        Check(
            "finished_without_attempts",
            "range",
            "every finished effect keeps its attempts until purged",
        ),
        Check(
            "ledger_guard_off",
            "state",
            "a deleted finished effect's key enters the key ledger (its trigger is on)",
        ),
        Check(
            "delivered_again_unasked",
            "range",
            "a delivered key goes out again only on an operator's resend",
        ),
        Check("lease_overdue", "state", "no lease outlives its expiry by more than the grace"),
        Check("held_batch_leased", "state", "no effect of a held batch is leased"),
        Check(
            "marker_counts", "range", "a marker's counts equal the effect and reject rows it counts"
        ),
        Check(
            "sent_after_expiry",
            "range",
            "no send of a finished effect started at or after its send-by time",
        ),
        Check(
            "expiry_overdue",
            "state",
            "no effect waits past its send-by time by more than the grace (the expiry pass runs)",
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Violation:
    check: str
    row_id: int
    key: str | None
    detail: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PassReport:
    violations: list[Violation]
    checked: dict[str, int]  # rows a range check read this pass
    caught_up: bool  # every range check reached the present

    @property
    def ok(self) -> bool:
        return not self.violations


@dataclasses.dataclass
class Checker:
    """One checker's watermarks and counts; call :meth:`run_pass` repeatedly."""

    grace_s: float = 300.0
    settle_s: float = 60.0
    chunk: int = 50_000
    limit: int = 100
    effect_id: int = 0
    batch_id: int = 0
    finished_at: dt.datetime = EPOCH
    finished_id: int = 0
    # Violations per check: sticky for range checks, the latest pass for state ones.
    counts: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(CHECKS, 0))

    def __post_init__(self) -> None:
        for field, value, low in (
            ("grace_s", self.grace_s, 0),
            ("settle_s", self.settle_s, 0),
            ("chunk", self.chunk, 1),
            ("limit", self.limit, 1),
        ):
            if not value >= low or value != value or value == float("inf"):
                raise ValueError(f"{field} must be a finite number >= {low}, got {value!r}")

    def run_pass(self, conn: Connection) -> PassReport:
        """Every state check, and one chunk of every range check."""
        found: list[Violation] = []
        checked: dict[str, int] = {}
        for name in (
            "sent_before_commit",
            "lease_overdue",
            "held_batch_leased",
            "expiry_overdue",
            "ledger_guard_off",
        ):
            rows = self._rows(conn, name, {"grace_s": self.grace_s})
            self.counts[name] = len(rows)
            found += rows
        caught_up = True
        for step in (self._effects_range, self._finished_range, self._markers_range):
            rows, n, done = step(conn)
            found += rows
            checked.update(n)
            caught_up = caught_up and done
        return PassReport(found, checked, caught_up)

    def run_until_current(self, conn: Connection) -> PassReport:
        """Passes until every range check reached the present: the whole history."""
        total = PassReport([], dict.fromkeys(("effects", "finished", "markers"), 0), False)
        while True:
            report = self.run_pass(conn)
            state = [v for v in report.violations if CHECKS[v.check].kind == "state"]
            ranged = [v for v in report.violations if CHECKS[v.check].kind == "range"]
            total.violations = (
                [v for v in total.violations if CHECKS[v.check].kind == "range"] + ranged + state
            )
            for k, v in report.checked.items():
                total.checked[k] = total.checked.get(k, 0) + v
            if report.caught_up:
                total.caught_up = True
                return total

    def _rows(self, conn: Connection, name: str, params: dict[str, Any]) -> list[Violation]:
        rows = conn.execute(_Q[name], {**params, "limit": self.limit}).all()
        return [Violation(name, int(r.id), r.key, str(r.detail)) for r in rows]

    def _effects_range(self, conn: Connection) -> tuple[list[Violation], dict[str, int], bool]:
        top = int(conn.execute(_Q["max_effect_id"]).scalar_one())
        hi = min(top, self.effect_id + self.chunk)
        rows = self._rows(conn, "effect_without_marker", {"lo": self.effect_id, "hi": hi})
        self.counts["effect_without_marker"] += len(rows)
        n = hi - self.effect_id
        self.effect_id = hi
        return rows, {"effects": n}, hi >= top

    def _markers_range(self, conn: Connection) -> tuple[list[Violation], dict[str, int], bool]:
        top = int(conn.execute(_Q["max_batch_id"]).scalar_one())
        hi = min(top, self.batch_id + self.chunk)
        rows = self._rows(conn, "marker_counts", {"lo": self.batch_id, "hi": hi})
        self.counts["marker_counts"] += len(rows)
        n = hi - self.batch_id
        self.batch_id = hi
        return rows, {"markers": n}, hi >= top

    def _finished_range(self, conn: Connection) -> tuple[list[Violation], dict[str, int], bool]:
        now = conn.execute(_Q["now"]).scalar_one()
        lo = {"lo_at": self.finished_at, "lo_id": self.finished_id}
        end = conn.execute(
            _Q["finished_chunk_end"],
            {**lo, "settled_at": now - dt.timedelta(seconds=self.settle_s), "chunk": self.chunk},
        ).first()
        if end is None:
            return [], {"finished": 0}, True
        window = {**lo, "hi_at": end.at, "hi_id": int(end.id)}
        rows: list[Violation] = []
        for name in (
            "finished_without_attempts",
            "delivered_again_unasked",
            "sent_after_expiry",
        ):
            found = self._rows(conn, name, window)
            self.counts[name] += len(found)
            rows += found
        n = int(conn.execute(_Q["finished_count"], window).scalar_one())
        self.finished_at, self.finished_id = end.at, int(end.id)
        return rows, {"finished": n}, n < self.chunk


def render(violations: Iterable[Violation]) -> list[str]:
    return [f"{v.check}: {_subject(v)}{v.detail}" for v in violations]


def _subject(v: Violation) -> str:
    """What the row names: an effect (with its key), a marker, or nothing (a check
    of the schema itself, row id 0)."""
    if v.key:
        return f"effect {v.row_id} key {v.key}: "
    return f"marker {v.row_id}: " if v.row_id else ""
