"""Operator actions (operator role): each needs a reason and is itself audited."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from spark_outbox.api.deps import Conn, EngineDep, Operator, Reader
from spark_outbox.api.params import NO_NUL, PAGE_LIMIT, Key, Name
from spark_outbox.api.responses import READ_ERRORS, WRITE_ERRORS
from spark_outbox.api.schemas import (
    ActionCreate,
    ActionDonePublic,
    BulkRequeueCreate,
    BulkRequeuePublic,
    ErasureCreate,
    ErasurePublic,
    HoldDecisionCreate,
    HoldDecisionPublic,
    OperatorActionPublic,
    RejectsRequeueCreate,
    RejectsRequeuePublic,
    RequeueCreate,
)
from spark_outbox.console import audit, erasure, holds, operations, rejects, subjects
from spark_outbox.console.filters import build_filter

router = APIRouter(tags=["operate"])


@router.post("/v1/effects/{key}/requeue", response_model=ActionDonePublic, responses=WRITE_ERRORS)
def requeue(conn: Conn, token: Operator, key: Key, body: RequeueCreate) -> ActionDonePublic:
    """A dead or expired effect becomes pending, due now; its attempt history stays. Past
    its send-by time it needs a new one (expires_at), else 422 naming the field."""
    operations.requeue(conn, key, actor=token.name, reason=body.reason, expires_at=body.expires_at)
    return ActionDonePublic(action="requeue", target=key)


@router.post("/v1/effects/{key}/cancel", response_model=ActionDonePublic, responses=WRITE_ERRORS)
def cancel(conn: Conn, token: Operator, key: Key, body: ActionCreate) -> ActionDonePublic:
    """A pending effect is cancelled: it will not be sent."""
    operations.cancel(conn, key, actor=token.name, reason=body.reason)
    return ActionDonePublic(action="cancel", target=key)


@router.post("/v1/endpoints/{name}/pause", response_model=ActionDonePublic, responses=WRITE_ERRORS)
def pause(conn: Conn, token: Operator, name: Name, body: ActionCreate) -> ActionDonePublic:
    """The dispatcher stops claiming the endpoint's effects; they stay pending."""
    operations.pause_endpoint(conn, name, actor=token.name, reason=body.reason)
    return ActionDonePublic(action="pause_endpoint", target=name)


@router.post("/v1/endpoints/{name}/resume", response_model=ActionDonePublic, responses=WRITE_ERRORS)
def resume(conn: Conn, token: Operator, name: Name, body: ActionCreate) -> ActionDonePublic:
    operations.resume_endpoint(conn, name, actor=token.name, reason=body.reason)
    return ActionDonePublic(action="resume_endpoint", target=name)


@router.post("/v1/effects/bulk-requeue", response_model=BulkRequeuePublic, responses=WRITE_ERRORS)
def bulk_requeue(conn: Conn, token: Operator, body: BulkRequeueCreate) -> BulkRequeuePublic:
    """Requeue the dead effects a filter matches; dry_run (the default) only counts them."""
    flt = build_filter(
        since=body.since,
        until=body.until,
        job=body.job,
        batch_id=body.batch_id,
        endpoint=body.endpoint,
        recipient=body.recipient,
        reference=body.reference,
        state="dead",
    )
    result = operations.bulk_requeue(
        conn, flt, cap=body.cap, dry_run=body.dry_run, actor=token.name, reason=body.reason
    )
    return BulkRequeuePublic.model_validate(result)


@router.post("/v1/batches/release", response_model=HoldDecisionPublic, responses=WRITE_ERRORS)
def release_batch(conn: Conn, token: Operator, body: HoldDecisionCreate) -> HoldDecisionPublic:
    """A batch the volume guard held: its effects become claimable (dry_run: count only)."""
    done = holds.release(
        conn, body.job, body.batch_id, actor=token.name, reason=body.reason, dry_run=body.dry_run
    )
    return HoldDecisionPublic.model_validate(done)


@router.post("/v1/batches/cancel", response_model=HoldDecisionPublic, responses=WRITE_ERRORS)
def cancel_batch(conn: Conn, token: Operator, body: HoldDecisionCreate) -> HoldDecisionPublic:
    """A batch the volume guard held: its pending effects are cancelled, none is sent."""
    done = holds.cancel(
        conn, body.job, body.batch_id, actor=token.name, reason=body.reason, dry_run=body.dry_run
    )
    return HoldDecisionPublic.model_validate(done)


@router.post("/v1/rejects/requeue", response_model=RejectsRequeuePublic, responses=WRITE_ERRORS)
def requeue_rejects(
    conn: Conn, token: Operator, body: RejectsRequeueCreate
) -> RejectsRequeuePublic:
    """A batch's effects rejected for naming an unregistered endpoint are enqueued again
    (register the endpoint first); other rejects stay. dry_run (the default) only counts."""
    done = rejects.requeue(
        conn,
        body.job,
        body.batch_id,
        actor=token.name,
        reason=body.reason,
        dry_run=body.dry_run,
        cap=body.cap,
    )
    return RejectsRequeuePublic.model_validate(done)


@router.post("/v1/erase", response_model=ErasurePublic, responses=WRITE_ERRORS)
def erase(engine: EngineDep, token: Operator, body: ErasureCreate) -> ErasurePublic:
    """One person's data out of the outbox (docs/operations.md, "Erasure"); unsent
    effects cancelled, keys kept. dry_run (the default) only lists what would change;
    the erasure runs in short transactions of batch_size effects, so it is not one
    unit of work: a failure midway leaves what was erased erased (run it again)."""
    who = subjects.person(
        recipient=body.recipient, reference=body.reference, payload_field=body.payload_field
    )
    done = erasure.run(
        engine,
        who,
        actor=token.name,
        reason=body.reason,
        dry_run=body.dry_run,
        batch_size=body.batch_size,
    )
    return ErasurePublic.model_validate(done)


@router.get(
    "/v1/operator-actions",
    response_model=list[OperatorActionPublic],
    responses=READ_ERRORS,
    tags=["read"],
)
def operator_actions(
    conn: Conn,
    token: Reader,
    limit: Annotated[int, PAGE_LIMIT] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=2**62, description="keyset: id <")] = None,
    actor: Annotated[
        str | None,
        Query(
            max_length=200,
            pattern=NO_NUL,
            description="only this actor's: `system` for the system's own",
        ),
    ] = None,
) -> list[OperatorActionPublic]:
    """The audit trail of operator actions and of the changes the system makes by
    itself (actor `system`), newest first (URLs masked for support)."""
    support = not token.is_operator
    actions = audit.operator_actions(
        conn, limit=limit, before_id=before_id, actor=actor, support=support
    )
    return [OperatorActionPublic.model_validate(a) for a in actions]
