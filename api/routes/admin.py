"""Administration (operator role): endpoints created, changed, archived and unarchived,
secrets rotated, dead effects recovered, tokens created and revoked; each audited
like the actions.

Secrets appear only in the answer to the operator who created or rotated them
(``Cache-Control: no-store``); support tokens cannot call any of these routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from spark_outbox.api.admin_schemas import (
    ArchiveCreate,
    ArchivedPublic,
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
from spark_outbox.console import admin, lifecycle, operations

router = APIRouter(tags=["administer"])

NO_STORE = "no-store"
# An e-mail endpoint always has these: null in an update leaves them as they are.
REQUIRED_SMTP = ("smtp_host", "smtp_port", "smtp_tls", "mail_from")


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
    return EndpointSecretPublic(endpoint=EndpointPublic.of(endpoint), signing_secret=secret)


@router.patch("/v1/endpoints/{name}", response_model=EndpointPublic, responses=WRITE_ERRORS)
def update_endpoint(
    conn: Conn, token: Operator, name: Name, body: EndpointUpdate
) -> EndpointPublic:
    """Change any setting but the signing secret (rotate-secret): URL, SMTP host, port,
    TLS mode, login, password and From address, timeout, retry schedule, limits,
    ordering, deduplicates; audited with old -> new values, a password as "(changed)"."""
    changes = body.model_dump(include=body.model_fields_set - {"reason"})
    for field in ("ordered", "deduplicates", "smtp_allow_plaintext_auth", *REQUIRED_SMTP):
        if field in changes and changes[field] is None:
            changes.pop(field)  # null: unchanged (a flag is on or off; these are never unset)
    updated = admin.update_endpoint(conn, name, changes, actor=token.name, reason=body.reason)
    return EndpointPublic.of(updated)


@router.post("/v1/endpoints/{name}/archive", response_model=ArchivedPublic, responses=WRITE_ERRORS)
def archive(conn: Conn, token: Operator, name: Name, body: ArchiveCreate) -> ArchivedPublic:
    """Archive: no new effects accepted, nothing sent, history kept. Refused (409) while
    effects are pending unless ``cancel_pending``, or while any is being sent."""
    done = lifecycle.archive(
        conn, name, cancel_pending=body.cancel_pending, actor=token.name, reason=body.reason
    )
    return ArchivedPublic(endpoint=done.endpoint, cancelled=done.cancelled)


@router.post(
    "/v1/endpoints/{name}/unarchive", response_model=EndpointPublic, responses=WRITE_ERRORS
)
def unarchive(conn: Conn, token: Operator, name: Name, body: ActionCreate) -> EndpointPublic:
    """Accept effects again, enabled or paused as before the archive."""
    return EndpointPublic.of(lifecycle.unarchive(conn, name, actor=token.name, reason=body.reason))


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
