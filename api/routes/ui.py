"""The support page: server-rendered HTML on the same store functions as the API.

Sign-in puts the bearer token in an HttpOnly, SameSite=Strict cookie, ``Secure``
unless ``OUTBOX_UI_INSECURE_COOKIE`` is set for plain HTTP on a developer's
machine. Jinja autoescapes every value. No JavaScript at all, and every /ui
response says so to the browser (``SECURITY_HEADERS``: a CSP without scripts,
no framing, no caching, no referrer).

Every form that changes something carries a CSRF token:

- signed in (requeue, cancel, sign-out): a token derived from the session's
  bearer token (``tokens.csrf_token``); a cross-site page can read neither.
- sign-in has no session yet: a double-submit token. Showing the form sets a
  random value in a pre-session cookie (``__Host-`` prefixed when Secure, so no
  sibling subdomain can plant one; HttpOnly, SameSite=Strict) and in a hidden
  field; the sign-in must bring both, equal. A page on another site can neither
  read nor set that cookie, and SameSite=Strict keeps the browser from sending
  it along with a cross-site POST at all, so a forged sign-in (login CSRF: the
  victim working under the attacker's token) fails. The value is random, not
  derived from a server secret, so any API replica accepts any other's form.

Sign-out can also revoke the signed-in token (``admin.revoke_token``, audited, as
``outbox tokens revoke`` does), for a token that may have leaked.
"""

from __future__ import annotations

import datetime as dt
import functools
import hmac
import secrets
from pathlib import Path
from typing import Annotated
from urllib.parse import urlencode

import jinja2
from fastapi import APIRouter, Cookie, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup

from spark_outbox.api.chart import svg as chart_svg
from spark_outbox.api.deps import Conn, SettingsDep, masked_for
from spark_outbox.api.params import Key
from spark_outbox.console import (
    admin,
    audit,
    health,
    operations,
    resend,
    tokens,
    uncertain,
)
from spark_outbox.core import timestamps, tracing
from spark_outbox.core.errors import NotFound, OutboxError
from spark_outbox.core.settings import Settings
from spark_outbox.core.timestamps import iso

COOKIE = "outbox_session"
CHART_HOURS = 6
SESSION_S = 12 * 3600
# What every /ui response says to the browser (api/app.py adds them).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
}

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


def _secure(settings: Settings) -> bool:
    return not settings.ui_insecure_cookie


def login_cookie(settings: Settings) -> str:
    """The pre-session cookie's name: ``__Host-`` binds it to this host (Secure only)."""
    return "__Host-outbox_login" if _secure(settings) else "outbox_login"


def render(request: Request, name: str, code: int = 200, **context: object) -> HTMLResponse:
    cookie = request.cookies.get(COOKIE)
    context["csrf"] = tokens.csrf_token(cookie) if cookie else ""
    return templates.TemplateResponse(request, name, context, status_code=code)


def _login_page(request: Request, code: int, error: str | None) -> HTMLResponse:
    """The sign-in form with a fresh double-submit token in a cookie and a hidden field."""
    settings: Settings = request.app.state.settings
    nonce = secrets.token_urlsafe(32)
    plain_http = request.url.scheme == "http" and _secure(settings)
    response = render(
        request, "login.html", code=code, error=error, login_csrf=nonce, plain_http=plain_http
    )
    response.set_cookie(
        login_cookie(settings),
        nonce,
        httponly=True,
        samesite="strict",
        secure=_secure(settings),
        path="/",
        max_age=3600,
    )
    return response


def error_page(request: Request, exc: OutboxError, status: int) -> Response:
    """Domain errors on /ui render a page; an unknown session sends you to sign in."""
    signing_in = request.url.path == "/ui/login"
    if status == 401 or (status == 403 and signing_in):
        # A first visit has no cookie and tried nothing: show the form, not an error.
        tried = request.cookies.get(COOKIE) or signing_in
        return _login_page(request, status, str(exc) if tried else None)
    return render(request, "error.html", code=status, error=str(exc), status_code=status)


def _check_csrf(expected: str, csrf: str) -> None:
    if not expected or not hmac.compare_digest(expected.encode(), csrf.encode()):
        raise tokens.PermissionDenied("the form is stale or forged; reload the page and retry")


@router.get("", response_class=HTMLResponse)
def home(request: Request, conn: Conn, token: Session) -> HTMLResponse:
    chart = chart_svg(health.activity(conn, hours=CHART_HOURS))
    return render(
        request,
        "home.html",
        token=token,
        status=health.status(conn),
        chart=chart,
        hours=CHART_HOURS,
    )


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request) -> HTMLResponse:
    return _login_page(request, 200, None)


@router.post("/login")
def login(
    request: Request,
    conn: Conn,
    settings: SettingsDep,
    token: Annotated[str, Form()],
    csrf: Annotated[str, Form()] = "",
) -> Response:
    """Sign in: the double-submit token first, then the bearer token."""
    _check_csrf(request.cookies.get(login_cookie(settings), ""), csrf)
    tokens.authenticate(conn, token.strip())
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        token.strip(),
        httponly=True,
        samesite="strict",
        secure=_secure(settings),
        max_age=SESSION_S,
    )
    response.delete_cookie(
        login_cookie(settings), path="/", secure=_secure(settings), samesite="strict"
    )
    return response


@router.post("/logout")
def logout(
    request: Request,
    conn: Conn,
    settings: SettingsDep,
    csrf: Annotated[str, Form()] = "",
    revoke: Annotated[bool, Form()] = False,
) -> Response:
    """Sign out (CSRF-checked); with ``revoke``, the token stops working everywhere."""
    cookie = request.cookies.get(COOKIE)
    if cookie:
        _check_csrf(tokens.csrf_token(cookie), csrf)
        if revoke:
            name = tokens.authenticate(conn, cookie).name
            admin.revoke_token(
                conn, name, actor=f"ui:{name}", reason="revoked by its holder at sign-out"
            )
    response = RedirectResponse("/ui", status_code=303)
    response.delete_cookie(COOKIE, secure=_secure(settings), httponly=True, samesite="strict")
    return response


def batch_url(job: str, batch_id: str, **more: str | None) -> str:
    """The batch page's URL, every part percent-encoded (ids may hold / ? # % and spaces);
    ``more``: its page cursors, those not None."""
    query = {"job": job, "batch_id": batch_id} | {k: v for k, v in more.items() if v}
    return "/ui/batch?" + urlencode(query)


def _batch_link(item: object) -> str:
    """Template filter: the batch page of anything with ``job`` and ``batch_id``."""
    return batch_url(str(getattr(item, "job", "")), str(getattr(item, "batch_id", "")))


templates.env.filters["batch_url"] = _batch_link


@router.get("/effects/{key}", response_class=HTMLResponse)
def effect(
    request: Request, conn: Conn, token: Session, settings: SettingsDep, key: Key
) -> HTMLResponse:
    detail = audit.effect_detail(conn, key, mask=masked_for(token, settings))
    return render(
        request,
        "effect.html",
        token=token,
        detail=detail,
        payload=detail.effect.payload,
        trace_url=functools.partial(tracing.viewer_url, settings.trace_url_template),
    )


@router.post("/effects/{key}/{action}")
def act(
    conn: Conn,
    token: Session,
    cookie: SessionCookie,
    key: Key,
    action: str,
    reason: Annotated[str, Form()],
    csrf: Annotated[str, Form()],
    expires_at: Annotated[str, Form()] = "",
) -> Response:
    """The requeue, cancel, mark-delivered, send-again and resend buttons (operators
    only, CSRF-checked); a requeue may carry a new send-by time."""
    _check_csrf(tokens.csrf_token(cookie), csrf)
    tokens.require_operator(token)
    if action == "requeue":
        send_by = timestamps.parse("expires_at", expires_at) if expires_at.strip() else None
        operations.requeue(conn, key, actor=token.name, reason=reason, expires_at=send_by)
    elif action == "cancel":
        operations.cancel(conn, key, actor=token.name, reason=reason)
    elif action in uncertain.ACTIONS:
        uncertain.resolve(conn, key, action, actor=token.name, reason=reason, dry_run=False)
    elif action == "resend":
        resend.resend(conn, key, actor=token.name, reason=reason, dry_run=False)
    else:
        raise NotFound(
            f"no action {action!r}; use requeue, cancel, mark_delivered, send_again or resend"
        )
    return RedirectResponse(f"/ui/effects/{key}", status_code=303)
