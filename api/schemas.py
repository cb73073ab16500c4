"""Pydantic models at the HTTP edge: ``*Public`` go out, ``*Create`` come in.

Built from the store's frozen dataclasses (``from_attributes``); secrets have
no field here, so they cannot be serialised by accident. Every instant goes out
as ``Instant``: ISO 8601 in UTC with ``Z`` (``spark_outbox.core.timestamps.iso``), the
format of the CSV export, the CLI and the support page too.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema

from spark_outbox.core.endpoint_state import ENDPOINT_STATES
from spark_outbox.core.timestamps import iso

Instant = Annotated[
    dt.datetime,
    PlainSerializer(iso, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]


class Public(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class ErrorPublic(BaseModel):
    detail: str


class EffectPublic(Public):
    idempotency_key: str
    job: str | None
    batch_id: str | None
    endpoint: str
    recipient: str | None
    reference: str | None = Field(description="the business reference, e.g. an invoice number")
    state: str
    attempt_count: int
    next_attempt_at: Instant | None = Field(
        description="when the next attempt is due; null once finished (delivered, dead, "
        "cancelled, expired)"
    )
    created_at: Instant
    updated_at: Instant
    delivered_at: Instant | None
    last_error: str | None
    purged_at: dt.datetime | None = Field(
        description="retention purged the payload and attempts; what is left is shown"
    )


class EffectRecordPublic(EffectPublic):
    payload: dict[str, Any] | None = Field(description="null once purged")
    payload_sha256: str
    ordering_key: str | None
    lease_owner: str | None
    lease_expires_at: Instant | None
    supersedes: str | None = Field(
        None, description="a correction: the key of the effect this one replaces"
    )
    resend_action_id: int | None = Field(
        None, description="the operator action of the latest resend asked for (see resend)"
    )
    expires_at: Instant | None = Field(
        None,
        description="the send-by time: after it the effect is never sent and ends expired "
        "(null: none)",
    )


class AttemptPublic(Public):
    attempt: int
    worker_id: str
    started_at: Instant
    duration_ms: float
    outcome: str
    status_code: int | None
    error_class: str | None
    error: str | None
    response_excerpt: str | None
    resend_action_id: int | None = Field(
        None, description="set on an attempt of an operator's resend: that operator action"
    )
    resend_by: str | None = Field(None, description="the operator who asked for the resend")
    # The attempt's trace (tracing on in the dispatcher): find it in a trace viewer.
    trace_id: str | None = None


class BatchPublic(Public):
    job: str
    batch_id: str
    run_id: uuid.UUID
    spark_app_id: str | None
    committed_at: Instant
    result_rows: int
    effects_total: int
    effects_new: int
    effects_deduplicated: int
    payload_mismatches: int
    rejects: int
    duration_s: float | None
    hold_state: str | None = Field(
        None, description="volume guard: null (never held), held, released or cancelled"
    )
    hold_reason: str | None = Field(None, description="why the volume guard held the batch")
    effects_purged: int = Field(
        0, description="of its new effects, those retention deleted (their keys stay known)"
    )


class OperatorActionPublic(Public):
    id: int
    at: Instant
    actor: str
    action: str
    target: str
    reason: str
    details: dict[str, Any]


class EffectDetailPublic(Public):
    effect: EffectRecordPublic
    attempts: list[AttemptPublic]
    batch: BatchPublic | None = Field(description="the commit marker of the producing batch")
    superseded_by: list[str] = Field(
        default_factory=list, description="keys of the corrections that replace this effect"
    )
    resend: OperatorActionPublic | None = Field(
        None, description="the latest resend an operator asked for (who, when, why)"
    )


class EffectPagePublic(Public):
    items: list[EffectPublic]
    next_cursor: str | None = Field(description="pass as cursor= for the next page; null: last")


class LiveCounts(BaseModel):
    pending: int
    leased: int
    delivered: int
    dead: int
    cancelled: int
    uncertain: int
    expired: int
    rejects: int


class BatchDetailPublic(Public):
    marker: BatchPublic
    live: LiveCounts


class StateCounts(BaseModel):
    pending: int
    leased: int
    delivered: int
    dead: int
    cancelled: int
    uncertain: int = Field(
        description="sends that started with an unknown outcome: an operator decides"
    )
    expired: int = Field(
        description="effects whose send-by time (expires_at) passed before they were sent: "
        "never sent"
    )


class WorkerPublic(Public):
    worker_id: str
    hostname: str
    pid: int
    started_at: Instant
    last_seen_at: Instant
    in_flight: int
    delivered: int
    failed: int


class EndpointHealthPublic(Public):
    name: str
    kind: str
    enabled: bool
    paused_reason: str | None
    paused_at: Instant | None
    last_delivered_at: Instant | None
    state: str = Field(
        description="what holds it back now, most binding first: "
        + ", ".join(ENDPOINT_STATES)
        + " (read from the data the dispatchers' claim obeys)"
    )
    state_reason: str | None = Field(description="the state in words; null when ready")
    consecutive_failures: int = Field(
        description="the failing streak: failed attempts since the last delivery"
    )
    failing_since: Instant | None = Field(description="when the streak's first failure started")
    last_failure: str | None = Field(
        description="the streak's last failure in our words (HTTP 503, Timeout)"
    )
    resting_until: Instant | None = Field(
        description="while the circuit breaker rests it: no dispatcher claims for it before"
    )
    in_flight: int = Field(description="sends leased now (counted while max_in_flight is set)")
    due_now: int = Field(description="its effects due now (the queue depth)")
    oldest_due_age_s: float = Field(description="how long its oldest due effect has waited")


class LastBatchPublic(Public):
    job: str
    batch_id: str
    committed_at: Instant
    effects_new: int
    rejects: int


class QueuePublic(Public):
    depth: int = Field(description="effects due now (claimable, next attempt not in the future)")
    oldest_due_age_s: float = Field(description="how long the oldest due effect has waited")
    as_of: Instant | None = Field(
        None,
        description="null: counted by this request; else when the queue's last full count was"
        " taken (beside 10,000 or more due effects: at most 15 s ago, a dispatcher's heartbeat"
        " apart while dispatchers run)",
    )


class HeldBatchPublic(Public):
    job: str
    batch_id: str
    committed_at: Instant
    effects_new: int
    hold_reason: str | None
    pending: int = Field(description="effects waiting for an operator's release or cancel")


class MismatchBatchPublic(Public):
    job: str
    batch_id: str
    committed_at: Instant
    payload_mismatches: int


class EnqueueMismatchPublic(Public):
    idempotency_key: str
    endpoint: str
    at: Instant


class StatusPublic(Public):
    counts: StateCounts
    queue: QueuePublic
    delivered_last_5m: int
    delivered_last_1h: int
    live_workers: list[WorkerPublic]
    endpoints: list[EndpointHealthPublic]
    last_batches: list[LastBatchPublic]
    held_batches: list[HeldBatchPublic] = Field(
        description="batches the volume guard holds: their effects wait for an operator"
    )
    payload_mismatches: list[MismatchBatchPublic] = Field(
        description="batches of the last 24 h that met stored keys with another payload"
    )
    enqueue_mismatches: list[EnqueueMismatchPublic] = Field(
        description="keys enqueue() met again with another payload in the last 24 h (newest "
        "20; the first payload stays)"
    )


class ActionCreate(BaseModel):
    reason: str = Field(
        min_length=1,
        max_length=2000,
        pattern=r"^[^\x00]*$",
        description="why; kept in the audit trail",
    )


class RequeueCreate(ActionCreate):
    expires_at: dt.datetime | None = Field(
        None,
        description="a new send-by time (with a zone, in the future); needed when the "
        "effect's own has passed, as an expired effect's has",
    )


class ActionDonePublic(BaseModel):
    action: str
    target: str


class BulkRequeueCreate(ActionCreate):
    since: dt.datetime
    until: dt.datetime
    job: str | None = Field(None, max_length=200, pattern=r"^[^\x00]*$")
    batch_id: str | None = Field(None, max_length=200, pattern=r"^[^\x00]*$")
    endpoint: str | None = Field(None, max_length=200, pattern=r"^[^\x00]*$")
    recipient: str | None = Field(None, max_length=320, pattern=r"^[^\x00]*$")
    reference: str | None = Field(None, max_length=200, pattern=r"^[^\x00]*$")
    cap: int = Field(1000, ge=1, le=10_000, description="refuse if more dead effects match")
    dry_run: bool = Field(True, description="only count; send false to requeue")


class HoldDecisionCreate(ActionCreate):
    job: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00]*$")
    batch_id: str = Field(min_length=1, max_length=1000, pattern=r"^[^\x00]*$")
    dry_run: bool = Field(False, description="only count the effects it would change")


class RejectsRequeueCreate(HoldDecisionCreate):
    cap: int = Field(1000, ge=1, le=10_000, description="refuse if more rejects match")
    dry_run: bool = Field(True, description="only count; send false to enqueue")


class RejectsRequeuePublic(Public):
    job: str
    batch_id: str
    matched: int = Field(
        description="rejects naming an unregistered endpoint, not requeued before "
        "(counted up to cap + 1; over the cap nothing is done)"
    )
    enqueued: int = Field(description="became new effects (or would, on a dry run)")
    known: int = Field(description="their key was already an effect: nothing new")
    still_refused: dict[str, int] = Field(
        description="reason -> rows that fail the checks again (e.g. still unregistered)"
    )
    dry_run: bool
    cap: int


class HoldDecisionPublic(Public):
    job: str
    batch_id: str
    action: str = Field(description="release or cancel")
    effects: int = Field(description="pending effects released or cancelled (or counted)")
    dry_run: bool


class BulkRequeuePublic(Public):
    matched: int
    requeued: int
    dry_run: bool
    cap: int


class RejectPublic(Public):
    id: int
    job: str
    batch_id: str
    run_id: uuid.UUID | None
    reason: str = Field(description="what is wrong, naming the field and the fix")
    raw_row: dict[str, Any] = Field(
        description="the row as the job produced it; masked for the support role"
    )
    rejected_at: Instant
    requeued_at: Instant | None = Field(
        None, description="when it was enqueued again (POST /v1/rejects/requeue)"
    )


class RejectPagePublic(Public):
    items: list[RejectPublic]
    next_cursor: str | None = Field(description="pass as cursor= for the next page; null: last")


class ReconciliationLinePublic(Public):
    category: str
    count: int
    explained: bool
    meaning: str


class ResultLinePublic(ReconciliationLinePublic):
    keys: list[dict[str, Any]] = Field(
        description="the conflict keys of the first rows of the category (up to 20), by name"
    )


class ResultsCheckPublic(Public):
    table: str | None = Field(description="the results table (null: the batch wrote none)")
    recorded: int = Field(description="result rows the batch recorded writing")
    lines: list[ResultLinePublic]
    cannot_know: list[str] = Field(description="what this check cannot tell, and why")
    unexplained: int


class ReconciliationPublic(Public):
    job: str
    batch_id: str
    committed_at: dt.datetime
    result_rows: int
    effect_rows: int = Field(description="what the job emitted for effects: valid rows + rejects")
    payload_mismatches: int
    attempts: int
    lines: list[ReconciliationLinePublic]
    foreign_keys: list[str] = Field(
        description="keys of the first effect rows carrying the batch's job and batch id that "
        "its run did not write (category foreign)"
    )
    results: ResultsCheckPublic = Field(
        description="the batch's result rows against what its results table holds now"
    )
    unexplained: int = Field(
        description="rows no category explains, effects and result rows; 0 when all adds up"
    )


class ErasureCreate(ActionCreate):
    """One person, by exactly one of recipient, reference or payload_field."""

    recipient: str | None = Field(None, max_length=320, pattern=r"^[^\x00]*$")
    reference: str | None = Field(None, max_length=200, pattern=r"^[^\x00]*$")
    payload_field: str | None = Field(
        None,
        max_length=1000,
        pattern=r"^[^\x00]*$",
        description="PATH=VALUE: the payload holds VALUE at dotted PATH, e.g. customer.id=42",
    )
    dry_run: bool = Field(True, description="only list what would change; send false to erase")
    batch_size: int = Field(1000, ge=1, le=10_000, description="effects per transaction")


class ErasureListedPublic(Public):
    idempotency_key: str
    endpoint: str
    state: str
    plan: str = Field(
        description="erase; cancel (unsent: cancelled, never sent, then erased); in_flight "
        "(being sent or of an uncommitted run: left, erase again later)"
    )


class ErasurePublic(Public):
    by: str = Field(description="recipient, reference or payload <path>")
    dry_run: bool
    effects: int = Field(description="effects erased (or that would be, on a dry run)")
    cancelled: int = Field(description="of those, unsent ones cancelled: never sent")
    attempts: int = Field(description="attempts whose receiver excerpt and error were blanked")
    rejects: int = Field(description="rejects whose raw row and reason were blanked")
    audit_rows: int = Field(description="audit rows whose quote of the value was blanked")
    in_flight: int = Field(description="left for now (being sent): run the erasure again")
    complete: bool = Field(description="nothing was left (in_flight is 0)")
    action_id: int | None = Field(description="the erase row in the operator actions")
    listed: list[ErasureListedPublic] = Field(description="the dry run's list (at most 100)")
