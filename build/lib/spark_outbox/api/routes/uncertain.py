"""Uncertain effects (docs/dispatcher.md, "Uncertain sends"): listed for both roles
(masked for support), resolved by operators only: marked delivered or sent again,
with a reason, a dry run, and an ``operator_actions`` row. An effect that is no
longer uncertain answers 409."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter
from pydantic import Field

from spark_outbox.api.deps import Conn, Operator, Reader, SettingsDep, masked_for
from spark_outbox.api.params import PAGE_LIMIT, Key, Name
from spark_outbox.api.responses import READ_ERRORS, WRITE_ERRORS
from spark_outbox.api.schemas import ActionCreate, Instant, Public
from spark_outbox.console import uncertain

router = APIRouter(tags=["operate"])

ACTION = r"^(mark_delivered|send_again)$"


class UncertainEffectPublic(Public):
    idempotency_key: str
    endpoint: str
    recipient: str | None
    reference: str | None
    attempt_count: int
    send_started_at: Instant | None = Field(description="when the send of unknown outcome began")
    updated_at: Instant
    last_error: str | None = Field(description="why it is uncertain (masked for support)")
    created_at: Instant


class ResolveCreate(ActionCreate):
    action: str = Field(pattern=ACTION, description="mark_delivered or send_again")
    dry_run: bool = Field(False, description="check only; change nothing")


class ResolveEndpointCreate(ResolveCreate):
    cap: int = Field(1000, ge=1, le=10_000, description="refuse if more uncertain effects match")
    dry_run: bool = Field(True, description="only count; send false to resolve")


class ResolutionPublic(Public):
    action: str = Field(description="mark_delivered or send_again")
    target: str = Field(description="the effect's key, or the endpoint of a bulk resolve")
    effects: int = Field(description="effects resolved (or, on a dry run, that would be)")
    dry_run: bool


@router.get(
    "/v1/uncertain-effects",
    response_model=list[UncertainEffectPublic],
    responses=READ_ERRORS,
    tags=["read"],
)
def uncertain_effects(
    conn: Conn, token: Reader, settings: SettingsDep, limit: Annotated[int, PAGE_LIMIT] = 100
) -> list[UncertainEffectPublic]:
    """Effects whose send started with an unknown outcome, oldest first."""
    found = uncertain.listed(conn, limit=limit, mask=masked_for(token, settings))
    return [UncertainEffectPublic.model_validate(e) for e in found]


@router.post("/v1/effects/{key}/resolve", response_model=ResolutionPublic, responses=WRITE_ERRORS)
def resolve(conn: Conn, token: Operator, key: Key, body: ResolveCreate) -> ResolutionPublic:
    """An uncertain effect: mark_delivered (key ledger, nothing sent) or send_again."""
    done = uncertain.resolve(
        conn, key, body.action, actor=token.name, reason=body.reason, dry_run=body.dry_run
    )
    return ResolutionPublic.model_validate(done)


@router.post(
    "/v1/endpoints/{name}/resolve-uncertain",
    response_model=ResolutionPublic,
    responses=WRITE_ERRORS,
)
def resolve_endpoint(
    conn: Conn, token: Operator, name: Name, body: ResolveEndpointCreate
) -> ResolutionPublic:
    """Every uncertain effect of the endpoint; dry_run (the default) only counts."""
    done = uncertain.resolve_endpoint(
        conn,
        name,
        body.action,
        cap=body.cap,
        actor=token.name,
        reason=body.reason,
        dry_run=body.dry_run,
    )
    return ResolutionPublic.model_validate(done)
