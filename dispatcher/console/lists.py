"""Lists as a support person reads them: "showing 100 of 171", a state's effects per
endpoint, the same reason a hundred times shown once with its count, and a report's
keys (or the prefixes it prints, ``13dd1f9d44fa…``) looked up all at once.

Every count stops at a cap (``COUNT_CAP``): a list of a million effects costs what
a list of ten thousand does, and says "more than 10,000". Queries are named in
``lists.sql``, each on an index (tests/api/test_audit_plans.py).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.console import rejects
from spark_outbox.console.filters import EffectFilter, InvalidFilter, build_filter
from spark_outbox.core import masking
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "lists.sql")

COUNT_CAP = 10_000
GROUPS = 20  # reasons shown grouped; the rest are in the list itself
MAX_LOOKUP = 1000  # keys or prefixes at once


@dataclasses.dataclass(frozen=True)
class Count:
    """A count that stopped at ``cap``: ``n`` is cap + 1 when there are more."""

    n: int
    cap: int = COUNT_CAP

    @property
    def over(self) -> bool:
        return self.n > self.cap

    def __str__(self) -> str:
        return f"more than {self.cap:,}" if self.over else f"{self.n:,}"


@dataclasses.dataclass(frozen=True)
class Reason:
    reason: str
    n: int


@dataclasses.dataclass(frozen=True)
class Found:
    """What one key or prefix of a lookup names: none, one, or (ambiguous) several."""

    asked: str
    effects: list[dict[str, Any]]
    problem: str | None = None  # not a key or prefix at all


def count(conn: Connection, flt: EffectFilter, cap: int = COUNT_CAP) -> Count:
    params = flt.params() | {"cap_plus_one": cap + 1}
    return Count(int(conn.execute(_Q["count_matching"], params).scalar_one()), cap)


def by_endpoint(
    conn: Connection, flt: EffectFilter, cap: int = COUNT_CAP
) -> list[tuple[str, Count]]:
    """``flt.state``'s effects per registered endpoint (within ``flt``'s window, if any)."""
    params = {"state": flt.state, "since": flt.since, "until": flt.until, "cap_plus_one": cap + 1}
    return [(r.endpoint, Count(r.n, cap)) for r in conn.execute(_Q["state_by_endpoint"], params)]


def errors_grouped(
    conn: Connection, flt: EffectFilter, *, mask: Sequence[str] = (), scan: int = COUNT_CAP
) -> list[Reason]:
    """The most frequent ``last_error`` texts of ``flt.state``'s newest ``scan`` effects;
    for support each masked with the payload of one effect that has it."""
    params = {
        "state": flt.state,
        "endpoint": flt.endpoint,
        "since": flt.since,
        "until": flt.until,
        "scan_limit": scan,
        "groups": GROUPS,
    }
    rows = conn.execute(_Q["errors_grouped"], params).all()
    if not mask or not rows:
        return [Reason(r.reason, r.n) for r in rows]
    found = conn.execute(_Q["payloads_by_id"], {"ids": [r.sample_id for r in rows]})
    payloads: dict[int, Any] = {p.id: p.payload for p in found}
    return [
        Reason(
            masking.mask_text(
                r.reason, mask, masking.masked_values(payloads.get(r.sample_id), mask)
            )
            or "",
            r.n,
        )
        for r in rows
    ]


def reject_reasons(
    conn: Connection, job: str, batch_id: str, *, mask: Sequence[str] = ()
) -> list[Reason]:
    """A batch's rejects by reason, most frequent first; masked for support as one
    reject's reason is (``rejects.masked``), with one raw row of each reason."""
    params = {"job": job, "batch_id": batch_id, "groups": GROUPS}
    rows = conn.execute(_Q["reject_reasons"], params).all()
    if not mask or not rows:
        return [Reason(r.reason, r.n) for r in rows]
    found = conn.execute(_Q["raw_rows_by_id"], {"ids": [r.sample_id for r in rows]})
    raw: dict[int, dict[str, Any]] = {s.id: s.raw_row for s in found}
    now = dt.datetime.now(dt.UTC)
    shown = []
    for r in rows:
        sample = rejects.Reject(
            r.sample_id, job, batch_id, uuid.UUID(int=0), r.reason, raw.get(r.sample_id, {}), now
        )
        shown.append(Reason(rejects.masked(sample, mask).reason, r.n))
    return shown


def held_by_endpoint(conn: Connection) -> list[tuple[str, int]]:
    """Effects waiting in held batches, per endpoint, most first."""
    return [(r.endpoint, r.n) for r in conn.execute(_Q["held_by_endpoint"])]


def lookup(conn: Connection, asked: Sequence[str]) -> list[Found]:
    """Each key or key prefix (as printed: ``13dd1f9d44fa…``) with the effects it names,
    in the order asked; one query for all of them."""
    if len(asked) > MAX_LOOKUP:
        raise InvalidFilter(
            "keys", f"{len(asked)} keys at once", f"look up at most {MAX_LOOKUP} at a time"
        )
    prefixes = [_prefix_or_none(text) for text in asked]
    wanted = [p for p in prefixes if p is not None]
    params = {"prefixes": wanted, "ends": [p + "g" for p in wanted]}
    matched: dict[int, list[dict[str, Any]]] = {}
    for row in conn.execute(_Q["by_key_prefix"], params).mappings():
        matched.setdefault(int(row["ord"]), []).append(dict(row))
    found, n = [], 0
    for text, prefix in zip(asked, prefixes, strict=True):
        if prefix is None:
            found.append(Found(text, [], "not a key or the start of one (8+ hex characters)"))
            continue
        n += 1
        found.append(Found(text, matched.get(n, [])))
    return found


def _prefix_or_none(text: str) -> str | None:
    try:
        return build_filter(since=None, until=None, key_prefix=text).key_prefix
    except InvalidFilter:
        return None
