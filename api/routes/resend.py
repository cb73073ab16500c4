"""Resend on request (docs/operations.md, "Resending"): operators send a delivered or
dead effect again, same key, with a reason; one by key, or many by a filter with a
cap and a dry run (the default, as for bulk requeue). Support sees resends on the
effect's timeline, not these routes."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter
from pydantic import Field

from spark_outbox.api.deps import Conn, Operator
from spark_outbox.api.params import Key
from spark_outbox.api.responses import WRITE_ERRORS
from spark_outbox.api.schemas import ActionCreate, Public
from spark_outbox.console import resend
from spark_outbox.console.filters import build_filter

router = APIRouter(tags=["operate"])

NO_NUL = r"^[^\x00]*$"


class ResendCreate(ActionCreate):
    dry_run: bool = Field(False, description="check only; change nothing")


class BulkResendCreate(ActionCreate):
    since: dt.datetime | None = Field(
        None, description="created at or after; needed unless the filter is narrow (docs)"
    )
    until: dt.datetime | None = Field(None, description="created before (exclusive)")
    job: str | None = Field(None, max_length=200, pattern=NO_NUL)
    batch_id: str | None = Field(None, max_length=1000, pattern=NO_NUL)
    endpoint: str | None = Field(None, max_length=200, pattern=NO_NUL)
    recipient: str | None = Field(None, max_length=320, pattern=NO_NUL)
    reference: str | None = Field(None, max_length=200, pattern=NO_NUL)
    state: str | None = Field(
        None, pattern=r"^(delivered|dead)$", description="delivered or dead (default: both)"
    )
    cap: int = Field(1000, ge=1, le=10_000, description="refuse if more effects match")
    dry_run: bool = Field(True, description="only count; send false to resend")


class ResendPublic(Public):
    target: str = Field(description="the effect's key, or the filter of a bulk resend")
    matched: int = Field(
        description="delivered or dead effects that can be sent again (a bulk's counted up "
        "to cap + 1; over the cap nothing is done)"
    )
    resent: int = Field(description="made pending, due now (0 on a dry run)")
    paused: int = Field(description="of the matched, waiting for their paused endpoint's resume")
    refused: dict[str, int] = Field(
        description="reason -> matching effects that cannot be sent again (erased, purged, "
        "archived endpoint, unregistered endpoint)"
    )
    dry_run: bool
    cap: int
    action_id: int | None = Field(description="the operator_actions row; null on a dry run")


@router.post("/v1/effects/{key}/resend", response_model=ResendPublic, responses=WRITE_ERRORS)
def resend_effect(conn: Conn, token: Operator, key: Key, body: ResendCreate) -> ResendPublic:
    """A delivered or dead effect is sent again, same key; its attempts show it as a resend.
    409 with the reason when it cannot be (not delivered or dead, erased, purged, its
    endpoint archived)."""
    done = resend.resend(conn, key, actor=token.name, reason=body.reason, dry_run=body.dry_run)
    return ResendPublic.model_validate(done)


@router.post("/v1/effects/bulk-resend", response_model=ResendPublic, responses=WRITE_ERRORS)
def bulk_resend(conn: Conn, token: Operator, body: BulkResendCreate) -> ResendPublic:
    """The delivered and dead effects a filter matches are sent again; dry_run (the
    default) only counts them, and the refused ones by reason. 409 over cap."""
    flt = build_filter(
        since=body.since,
        until=body.until,
        job=body.job,
        batch_id=body.batch_id,
        endpoint=body.endpoint,
        recipient=body.recipient,
        reference=body.reference,
        state=body.state,
    )
    done = resend.bulk_resend(
        conn, flt, cap=body.cap, dry_run=body.dry_run, actor=token.name, reason=body.reason
    )
    return ResendPublic.model_validate(done)
