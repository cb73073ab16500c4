"""The support page's audit view: every operator action and every change the system
made by itself (actor ``system``: a 410's pause, the automatic disable, a breaker's
rest, a held batch, a retention run), newest first, as ``GET /v1/operator-actions``
lists them (URLs masked for the support role)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from spark_outbox.api.deps import Conn
from spark_outbox.api.params import NO_NUL
from spark_outbox.api.routes.ui import Session, render
from spark_outbox.console import audit
from spark_outbox.core.auditlog import SYSTEM_ACTOR

router = APIRouter(prefix="/ui", include_in_schema=False)
AUDIT_PAGE = 100


@router.get("/audit", response_class=HTMLResponse)
def audit_page(
    request: Request,
    conn: Conn,
    token: Session,
    actor: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> HTMLResponse:
    actor = actor or None
    actions = audit.operator_actions(
        conn,
        limit=AUDIT_PAGE,
        before_id=before_id,
        actor=actor,
        support=not token.is_operator,
    )
    older = None
    if len(actions) == AUDIT_PAGE:
        query = {"before_id": actions[-1].id} | ({"actor": actor} if actor else {})
        older = f"/ui/audit?{urlencode(query)}"
    return render(
        request,
        "audit.html",
        token=token,
        actions=actions,
        actor=actor,
        system=SYSTEM_ACTOR,
        older=older,
    )
