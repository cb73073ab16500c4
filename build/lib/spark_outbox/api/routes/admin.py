"""Administration (operator role): endpoints created and changed, secrets rotated,
dead effects recovered, tokens created and revoked; each audited like the actions.

Secrets appear only in the answer to the operator who created or rotated them
(``Cache-Control: no-store``); support tokens cannot call any of these routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from spark_outbox.api.admin_schemas import (
    EndpointPublic,
    EndpointSecretPublic,
    EndpointUpdate,
    RecoverCreate,
    RotateSecretCreate,
    RotationPublic,
    TokenCreate,
    TokenSecretPublic,
    WebhookCreate,
)
from spark_outbox.api.deps import Conn, Operator
from spark_outbox.api.params import Name
from spark_outbox.api.responses import WRITE_ERRORS
from spark_outbox.api.schemas import ActionCreate, ActionDonePublic, BulkRequeuePublic
from spark_outbox.console import admin, operations

router = APIRouter(tags=["administer"])

NO_STORE = "no-store"


@router.post("/v1/endpoints", response_model=EndpointSecretPublic, responses=WRITE_ERRORS)
def create_webhook(
    conn: Conn, token: Operator, body: WebhookCreate, response: Response
) -> EndpointSecretPublic:
    """Register a webhook endpoint; its generated signing secret is in this answer only."""
    endpoint, secret = admin.create_webhook(
        conn,
        actor=token.name,
        reason=body.reason,
        **body.model_dump(exclude={"reason"}),
    )
    response.headers["Cache-Control"] = NO_STORE
    return EndpointSecretPublic(
        endpoint=EndpointPublic.model_validate(endpoint), signing_secret=secret
    )


@router.patch("/v1/endpoints/{name}", response_model=EndpointPublic, responses=WRITE_ERRORS)
def update_endpoint(
    conn: Conn, token: Operator, name: Name, body: EndpointUpdate
) -> EndpointPublic:
    """Change URL, timeout, retry schedule, limits, ordering or deduplicates; audited
    with old -> new values."""
    changes = body.model_dump(include=body.model_fields_set - {"reason"})
    for flag in ("ordered", "deduplicates"):
        if changes.get(flag, False) is None:
            changes.pop(flag)  # null: unchanged (the flag is on or off, never unset)
    updated = admin.update_endpoint(conn, name, changes, actor=token.name, reason=body.reason)
    return EndpointPublic.model_validate(updated)


@router.post(
    "/v1/endpoints/{name}/rotate-secret", response_model=RotationPublic, responses=WRITE_ERRORS
)
def rotate_secret(
    conn: Conn, token: Operator, name: Name, body: RotateSecretCreate, response: Response
) -> RotationPublic:
    """A new signing secret; the old one signs beside it for ``overlap_s`` (default 24 h)."""
    done = admin.rotate_secret(
        conn, name, overlap_s=body.overlap_s, actor=token.name, reason=body.reason
    )
    response.headers["Cache-Control"] = NO_STORE
    return RotationPublic(
        endpoint=done.endpoint,
        signing_secret=done.signing_secret,
        previous_valid_until=done.previous_valid_until,
    )


@router.post(
    "/v1/endpoints/{name}/recover", response_model=BulkRequeuePublic, responses=WRITE_ERRORS
)
def recover(conn: Conn, token: Operator, name: Name, body: RecoverCreate) -> BulkRequeuePublic:
    """Requeue the endpoint's effects that died since ``since``; dry_run (default) counts."""
    done = operations.recover_endpoint(
        conn,
        name,
        since=body.since,
        cap=body.cap,
        dry_run=body.dry_run,
        actor=token.name,
        reason=body.reason,
    )
    return BulkRequeuePublic.model_validate(done)


@router.post("/v1/tokens", response_model=TokenSecretPublic, responses=WRITE_ERRORS)
def create_token(
    conn: Conn, token: Operator, body: TokenCreate, response: Response
) -> TokenSecretPublic:
    """A new API token; its value is in this answer only (stored as sha256)."""
    created, plaintext = admin.create_token(
        conn, name=body.name, role=body.role, actor=token.name, reason=body.reason
    )
    response.headers["Cache-Control"] = NO_STORE
    return TokenSecretPublic(name=created.name, role=created.role, token=plaintext)


@router.post("/v1/tokens/{name}/revoke", response_model=ActionDonePublic, responses=WRITE_ERRORS)
def revoke_token(conn: Conn, token: Operator, name: Name, body: ActionCreate) -> ActionDonePublic:
    admin.revoke_token(conn, name, actor=token.name, reason=body.reason)
    return ActionDonePublic(action="revoke_token", target=name)
