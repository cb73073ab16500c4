"""The delivery audit, read side: one effect with its timeline, the search, batches.

Support staff ask "did customer X get invoice Y, when, how many tries, what did
their server answer?". Every query here is named in ``audit.sql`` and served by
an index (tests/api/test_audit_plans.py proves it with EXPLAIN).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy.engine import Connection, Engine, RowMapping

from spark_outbox.console.filters import Cursor, EffectFilter, check_limit
from spark_outbox.core import masking, tracing
from spark_outbox.core.errors import InvalidRequest, NotFound
from spark_outbox.core.schema import EFFECT_STATES
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "audit.sql")

MAX_ATTEMPTS_SHOWN = 500
EXPORT_CHUNK = 500  # rows masked together (one payload lookup per chunk)
_LEDGER_VERBS = {
    "delivered": "delivered to",
    "dead": "dead-lettered on",
    "cancelled": "cancelled on",
    "expired": "expired unsent (its send-by time passed) on",
}

T = TypeVar("T")


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def from_row(cls: type[T], row: RowMapping | Mapping[str, Any]) -> T:
    """Build a dataclass from the row's columns of the same names (a search page builds 500)."""
    names = _field_names(cls)  # type: ignore[arg-type]
    return cls(**{name: row[name] for name in names})


@dataclasses.dataclass(frozen=True)
class EffectSummary:
    id: int
    idempotency_key: str
    job: str | None
    batch_id: str | None
    endpoint: str
    recipient: str | None
    reference: str | None
    state: str
    attempt_count: int
    next_attempt_at: dt.datetime | None  # None once finished: delivered, dead, cancelled, expired
    created_at: dt.datetime
    updated_at: dt.datetime
    delivered_at: dt.datetime | None
    last_error: str | None
    # Retention purged the payload and attempts; what is left is this summary.
    purged_at: dt.datetime | None


@dataclasses.dataclass(frozen=True)
class EffectRecord(EffectSummary):
    payload: dict[str, Any] | None  # None once purged
    payload_sha256: str
    ordering_key: str | None
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    supersedes: str | None  # a correction: the key of the effect it replaces
    resend_action_id: int | None  # the operator's latest resend of it (operator_actions.id)
    expires_at: dt.datetime | None  # the send-by time: never sent after it (None: none)


@dataclasses.dataclass(frozen=True)
class Attempt:
    attempt: int
    worker_id: str
    started_at: dt.datetime
    duration_ms: float
    outcome: str
    status_code: int | None
    error_class: str | None
    error: str | None
    response_excerpt: str | None
    resend_action_id: int | None = None  # an attempt of an operator's resend
    resend_by: str | None = None  # ... and the operator who asked for it
    # The attempt's send span (W3C traceparent), when the dispatcher traced it.
    trace_parent: str | None = None

    @property
    def trace_id(self) -> str | None:
        return tracing.trace_id(self.trace_parent)


@dataclasses.dataclass(frozen=True)
class BatchMarker:
    job: str
    batch_id: str
    run_id: Any
    spark_app_id: str | None
    committed_at: dt.datetime
    result_rows: int
    effects_total: int
    effects_new: int
    effects_deduplicated: int
    payload_mismatches: int
    rejects: int
    duration_s: float | None
    hold_state: str | None  # the volume guard: held, released, cancelled (None: never held)
    hold_reason: str | None
    effects_purged: int  # of its new effects, those retention deleted


@dataclasses.dataclass(frozen=True)
class OperatorAction:
    id: int
    at: dt.datetime
    actor: str
    action: str
    target: str
    reason: str
    details: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class EffectDetail:
    effect: EffectRecord
    attempts: list[Attempt]
    batch: BatchMarker | None
    superseded_by: list[str] = dataclasses.field(default_factory=list)  # its corrections
    resend: OperatorAction | None = None  # the latest resend an operator asked for


@dataclasses.dataclass(frozen=True)
class EffectPage:
    items: list[EffectSummary]
    next_cursor: str | None


@dataclasses.dataclass(frozen=True)
class BatchDetail:
    marker: BatchMarker
    # pending, leased, delivered, dead, cancelled, uncertain, expired (all present, zero
    # if none) and rejects.
    live: dict[str, int]


def not_found(conn: Connection, key: str) -> NotFound:
    """No effect row has ``key``: what the key ledger still says of it, if anything
    (retention deleted its effect), else plainly not found."""
    ledger = conn.execute(_Q["ledger_entry"], {"key": key}).mappings().first()
    if ledger is None:
        return NotFound(f"no effect with key {key!r}")
    verb = _LEDGER_VERBS.get(ledger["state"], f"{ledger['state']} on")
    return NotFound(
        f"effect {key} was {verb} {ledger['endpoint']} at "
        f"{ledger['finished_at'].isoformat()}; retention has deleted its record"
    )


def effect_detail(conn: Connection, key: str, *, mask: Sequence[str] = ()) -> EffectDetail:
    """The effect with its attempts and marker; ``mask``: the support role's view
    (``masking``: the payload and every text that came from outside)."""
    row = conn.execute(_Q["effect_by_key"], {"key": key}).mappings().first()
    if row is None:
        raise not_found(conn, key)
    effect = from_row(EffectRecord, row)
    if effect.purged_at is not None:
        effect = dataclasses.replace(effect, payload=None)
    attempts = [
        from_row(Attempt, r)
        for r in conn.execute(
            _Q["attempts_of_effect"], {"effect_id": effect.id, "limit": MAX_ATTEMPTS_SHOWN}
        ).mappings()
    ]
    batch = None
    if effect.job is not None:
        marker = conn.execute(
            _Q["batch_marker"], {"job": effect.job, "batch_id": effect.batch_id}
        ).mappings()
        found = marker.first()
        batch = from_row(BatchMarker, found) if found is not None else None
    later = [r[0] for r in conn.execute(_Q["superseded_by"], {"key": key})]
    resend = None
    if effect.resend_action_id is not None:
        found_action = conn.execute(_Q["action_by_id"], {"id": effect.resend_action_id})
        resend = from_row(OperatorAction, found_action.mappings().one())
    detail = EffectDetail(
        effect=effect, attempts=attempts, batch=batch, superseded_by=later, resend=resend
    )
    return _masked_detail(detail, mask) if mask else detail


def _masked_detail(detail: EffectDetail, paths: Sequence[str]) -> EffectDetail:
    values = masking.masked_values(detail.effect.payload, paths)

    def text(value: str | None) -> str | None:
        return masking.mask_text(value, paths, values)

    effect = dataclasses.replace(
        detail.effect,
        payload=masking.mask_payload(detail.effect.payload, paths),
        last_error=text(detail.effect.last_error),
    )
    attempts = [
        dataclasses.replace(a, error=text(a.error), response_excerpt=text(a.response_excerpt))
        for a in detail.attempts
    ]
    resend = detail.resend
    if resend is not None:  # an operator's reason may quote the customer
        resend = dataclasses.replace(resend, reason=masking.mask_urls(text(resend.reason) or ""))
    return dataclasses.replace(detail, effect=effect, attempts=attempts, resend=resend)


def _masked_summaries(
    conn: Connection, items: list[EffectSummary], paths: Sequence[str]
) -> list[EffectSummary]:
    """``last_error`` masked with each effect's own payload (one lookup by primary key)."""
    ids = [e.id for e in items if e.last_error]
    if not ids:
        return items
    rows = conn.execute(_Q["payloads_by_id"], {"ids": ids})
    payloads: dict[int, dict[str, Any]] = {r.id: r.payload for r in rows}
    return [
        dataclasses.replace(
            e,
            last_error=masking.mask_text(
                e.last_error, paths, masking.masked_values(payloads.get(e.id, {}), paths)
            ),
        )
        if e.last_error
        else e
        for e in items
    ]


def _search_params(flt: EffectFilter, limit: int | None, cursor: Cursor | None) -> dict[str, Any]:
    return flt.params() | {
        "limit": limit,
        "cursor_at": cursor.created_at if cursor else None,
        "cursor_id": cursor.id if cursor else None,
    }


def search(
    conn: Connection,
    flt: EffectFilter,
    *,
    limit: int = 100,
    cursor: str | None = None,
    mask: Sequence[str] = (),
) -> EffectPage:
    """One keyset page; ``next_cursor`` is None on the last page."""
    limit = check_limit(limit)
    after = Cursor.decode(cursor) if cursor else None
    rows = conn.execute(_Q["search_effects"], _search_params(flt, limit + 1, after)).mappings()
    items = [from_row(EffectSummary, r) for r in rows]
    next_cursor = None
    if len(items) > limit:
        items = items[:limit]
        next_cursor = Cursor(items[-1].created_at, items[-1].id).encode()
    if mask:
        items = _masked_summaries(conn, items, mask)
    return EffectPage(items=items, next_cursor=next_cursor)


def export(
    engine: Engine, flt: EffectFilter, *, mask: Sequence[str] = ()
) -> Iterator[EffectSummary]:
    """Every matching effect, streamed from a server-side cursor (the CSV export).

    Opens its own connection because the rows outlive the request's unit of work.
    """
    with engine.connect() as conn:
        result = conn.execution_options(stream_results=True, max_row_buffer=1000).execute(
            _Q["search_effects"], _search_params(flt, None, None)
        )
        for rows in result.mappings().partitions(EXPORT_CHUNK):
            items = [from_row(EffectSummary, r) for r in rows]
            yield from _masked_summaries(conn, items, mask) if mask else items


def batch_detail(conn: Connection, job: str, batch_id: str) -> BatchDetail:
    found = conn.execute(_Q["batch_marker"], {"job": job, "batch_id": batch_id}).mappings().first()
    if found is None:
        raise NotFound(f"no committed batch {batch_id!r} of job {job!r}")
    params = {"job": job, "batch_id": batch_id}
    live = dict.fromkeys(EFFECT_STATES, 0)
    for state, n in conn.execute(_Q["batch_live_counts"], params):
        live[state] = n
    live["rejects"] = conn.execute(_Q["batch_reject_count"], params).scalar_one()
    return BatchDetail(marker=from_row(BatchMarker, found), live=live)


def batch_exists(conn: Connection, job: str, batch_id: str) -> bool:
    return bool(conn.execute(_Q["batch_exists"], {"job": job, "batch_id": batch_id}).scalar())


def batches_of_job(conn: Connection, job: str, *, limit: int = 100) -> list[BatchMarker]:
    rows = conn.execute(_Q["batches_of_job"], {"job": job, "limit": check_limit(limit)})
    return [from_row(BatchMarker, r) for r in rows.mappings()]


def operator_actions(
    conn: Connection,
    *,
    limit: int = 100,
    before_id: int | None = None,
    actor: str | None = None,
    support: bool = False,
) -> list[OperatorAction]:
    """The trail, newest first (``actor``'s only, when given); ``support``: every URL
    in it masked (``masking``, rule 3), rows recorded before URLs were masked on the
    way in included."""
    if actor is not None and "\x00" in actor:  # PostgreSQL's text holds no NUL
        raise InvalidRequest("actor", "contains a NUL character", "give a name from the trail")
    params = {"limit": check_limit(limit), "before_id": before_id, "actor": actor}
    rows = conn.execute(_Q["operator_actions"], params)
    actions = [from_row(OperatorAction, r) for r in rows.mappings()]
    if not support:
        return actions
    return [
        dataclasses.replace(
            a,
            target=masking.mask_urls(a.target),
            reason=masking.mask_urls(a.reason),
            details=_urls_masked(a.details),
        )
        for a in actions
    ]


def _urls_masked(value: Any) -> Any:
    if isinstance(value, str):
        return masking.mask_urls(value)
    if isinstance(value, dict):
        return {k: _urls_masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_urls_masked(v) for v in value]
    return value
