"""The support page: server-rendered HTML on the same store functions as the API.

Sign-in puts the bearer token in an HttpOnly, SameSite=Strict cookie; every
form that changes something carries a CSRF token derived from it
(``tokens.csrf_token``). Jinja autoescapes every value. No JavaScript at all.
"""

from __future__ import annotations

import datetime as dt
import hmac
import re
from pathlib import Path
from typing import Annotated

import jinja2
from fastapi import APIRouter, Cookie, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from api.deps import Conn, SettingsDep
from api.params import Key
from dispatcher import audit, health, operations, tokens
from dispatcher.errors import NotFound, OutboxError
from dispatcher.filters import MAX_PAGE, MAX_RANGE_DAYS, build_filter
from dispatcher.timestamps import iso

COOKIE = "outbox_session"
KEY = re.compile(r"^[0-9a-f]{64}$")

templates = Jinja2Templates(
    env=jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parents[1] / "templates"),
        autoescape=True,
    )
)


def _ts(at: dt.datetime | None) -> Markup:
    """Timestamps to the second in UTC, what a support person reads, in a ``<time>``
    element carrying the exact instant as the API and CSV write it (``iso``)."""
    if at is None:
        return Markup("")
    shown = f"{at.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S} UTC"
    return Markup('<time datetime="{}">{}</time>').format(iso(at), shown)


templates.env.filters["ts"] = _ts
router = APIRouter(prefix="/ui", include_in_schema=False)


def session(conn: Conn, cookie: Annotated[str | None, Cookie(alias=COOKIE)] = None) -> tokens.Token:
    """The signed-in token, from the session cookie (``AuthenticationFailed`` if none)."""
    return tokens.authenticate(conn, cookie)


Session = Annotated[tokens.Token, Depends(session)]
SessionCookie = Annotated[str, Cookie(alias=COOKIE)]


def _page(request: Request, name: str, code: int = 200, **context: object) -> HTMLResponse:
    cookie = request.cookies.get(COOKIE)
    context["csrf"] = tokens.csrf_token(cookie) if cookie else ""
    return templates.TemplateResponse(request, name, context, status_code=code)


def error_page(request: Request, exc: OutboxError, status: int) -> Response:
    """Domain errors on /ui render a page; an unknown session sends you to sign in."""
    if status == 401:
        # A first visit has no cookie and tried nothing: show the form, not an error.
        tried = request.cookies.get(COOKIE) or request.url.path == "/ui/login"
        error = str(exc) if tried else None
        return _page(request, "login.html", code=401, error=error)
    return _page(request, "error.html", code=status, error=str(exc), status_code=status)


def _check_csrf(cookie: str, csrf: str) -> None:
    if not hmac.compare_digest(tokens.csrf_token(cookie), csrf):
        raise tokens.PermissionDenied("the form is stale or forged; reload the page and retry")


@router.get("", response_class=HTMLResponse)
def home(request: Request, conn: Conn, token: Session) -> HTMLResponse:
    return _page(request, "home.html", token=token, status=health.status(conn))


@router.post("/login")
def login(request: Request, conn: Conn, token: Annotated[str, Form()]) -> Response:
    tokens.authenticate(conn, token.strip())
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        token.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        max_age=12 * 3600,
    )
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse("/ui", status_code=303)
    response.delete_cookie(COOKIE)
    return response


@router.get("/search", response_class=HTMLResponse)
def search(request: Request, conn: Conn, token: Session, q: str = "") -> Response:
    """One box: a key opens the effect, ``job/batch_id`` a batch, anything else a recipient."""
    q = q.strip().replace("\x00", "")
    if KEY.match(q):
        return RedirectResponse(f"/ui/effects/{q}", status_code=303)
    now = dt.datetime.now(dt.UTC)
    batch = None
    if "/" in q:
        job, batch_id = q.split("/", 1)
        batch = audit.batch_detail(conn, job, batch_id)
        at = batch.marker.committed_at
        flt = build_filter(
            since=at - dt.timedelta(days=MAX_RANGE_DAYS - 1),
            until=at + dt.timedelta(days=1),
            job=job,
            batch_id=batch_id,
        )
    elif q:
        until = now + dt.timedelta(minutes=1)
        since = until - dt.timedelta(days=MAX_RANGE_DAYS)
        flt = build_filter(since=since, until=until, recipient=q)
    else:
        return RedirectResponse("/ui", status_code=303)
    page = audit.search(conn, flt, limit=MAX_PAGE)
    return _page(
        request, "results.html", token=token, q=q, batch=batch, page=page, days=MAX_RANGE_DAYS
    )


@router.get("/effects/{key}", response_class=HTMLResponse)
def effect(
    request: Request, conn: Conn, token: Session, settings: SettingsDep, key: Key
) -> HTMLResponse:
    detail = audit.effect_detail(conn, key)
    payload = detail.effect.payload
    if not token.is_operator:
        payload = audit.mask_payload(payload, settings.sensitive_fields)
    return _page(request, "effect.html", token=token, detail=detail, payload=payload)


@router.post("/effects/{key}/{action}")
def act(
    conn: Conn,
    token: Session,
    cookie: SessionCookie,
    key: Key,
    action: str,
    reason: Annotated[str, Form()],
    csrf: Annotated[str, Form()],
) -> Response:
    """The requeue and cancel buttons (operators only, CSRF-checked)."""
    _check_csrf(cookie, csrf)
    tokens.require_operator(token)
    if action == "requeue":
        operations.requeue(conn, key, actor=token.name, reason=reason)
    elif action == "cancel":
        operations.cancel(conn, key, actor=token.name, reason=reason)
    else:
        raise NotFound(f"no action {action!r}; use requeue or cancel")
    return RedirectResponse(f"/ui/effects/{key}", status_code=303)
