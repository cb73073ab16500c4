"""The support page's finding pages: the search box, the lists the overview's tiles
lead to (a state's effects, by endpoint, reasons grouped; held batches), a batch
with its effects and rejects, and the uncertain sends.

Every list is a keyset page of ``PAGE`` rows with its count ("101–171 of 171";
counts stop at ``lists.COUNT_CAP``). Narrow lists (a state an effect leaves or an
operator must look at, a batch, a recipient, a reference, a key prefix) cover any
age; the delivered and cancelled lists, history, the last 31 days.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from typing import Annotated
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from spark_outbox.api.deps import Conn, SettingsDep, masked_for
from spark_outbox.api.routes.ui import Session, batch_url, render
from spark_outbox.console import audit, holds, lists, reconcile, rejects, uncertain
from spark_outbox.console.audit import EffectPage
from spark_outbox.console.filters import (
    MAX_PAGE,
    MAX_RANGE_DAYS,
    MIN_KEY_PREFIX,
    WORK_STATES,
    EffectFilter,
    build_filter,
)
from spark_outbox.core.schema import EFFECT_STATES
from spark_outbox.core.validation import MAX_REFERENCE_CHARS

PAGE = 100
KEY = re.compile(r"^[0-9a-f]{64}$")
KEY_PREFIX = re.compile(rf"^[0-9a-fA-F]{{{MIN_KEY_PREFIX},63}}(…|\.\.\.)?$")
SEARCH_ORDER = (
    "an idempotency key (64 hex characters) opens the effect",
    f"the start of a key as reports print it (at least {MIN_KEY_PREFIX} hex characters, "
    "e.g. 13dd1f9d44fa…) opens its effect, or lists them if several share it",
    "job/batch_id of a committed batch opens the batch",
    "a business reference (e.g. an invoice number), exact, any age",
    "a recipient, exact, any age",
)
Cursor = Annotated[str | None, Query(max_length=200)]
Position = Annotated[int, Query(ge=1, le=10**9)]

router = APIRouter(prefix="/ui", include_in_schema=False)


@dataclasses.dataclass(frozen=True)
class Pager:
    """Where a page sits in its list: rows ``first``..``last`` of ``total``."""

    first: int
    last: int
    total: lists.Count
    next_url: str | None
    first_url: str | None


def _pager(page: EffectPage, total: lists.Count, first: int, url: str) -> Pager:
    """``url`` is the list's own, without cursor: the next page adds it, and its position."""
    last = first + len(page.items) - 1
    glue = "&" if "?" in url else "?"
    following = urlencode({"cursor": page.next_cursor, "n": last + 1}) if page.next_cursor else ""
    return Pager(
        first=first,
        last=last,
        total=total,
        next_url=f"{url}{glue}{following}" if following else None,
        first_url=url if first > 1 else None,
    )


@router.get("/search", response_class=HTMLResponse)
def search(
    request: Request,
    conn: Conn,
    token: Session,
    settings: SettingsDep,
    q: str = "",
    cursor: Cursor = None,
    n: Position = 1,
) -> Response:
    """One box; the first that matches wins (SEARCH_ORDER, shown on the page)."""
    q = q.strip().replace("\x00", "")
    if not q:
        return RedirectResponse("/ui", status_code=303)
    if KEY.match(q):
        return RedirectResponse(f"/ui/effects/{q}", status_code=303)
    if "/" in q:
        job, batch_id = q.split("/", 1)
        if audit.batch_exists(conn, job, batch_id):
            return RedirectResponse(batch_url(job, batch_id), status_code=303)
    mask = masked_for(token, settings)
    for matched in ("key_prefix", "reference", "recipient"):
        if matched == "key_prefix" and not KEY_PREFIX.match(q):
            continue
        flt = build_filter(since=None, until=None, **{matched: q[:MAX_REFERENCE_CHARS]})
        page = audit.search(conn, flt, limit=PAGE, cursor=cursor, mask=mask)
        if page.items:
            break
    if matched == "key_prefix" and len(page.items) == 1 and cursor is None:
        return RedirectResponse(f"/ui/effects/{page.items[0].idempotency_key}", status_code=303)
    found = bool(page.items)
    return render(
        request,
        "results.html",
        token=token,
        q=q,
        page=page,
        pager=_pager(page, lists.count(conn, flt), n, "/ui/search?" + urlencode({"q": q})),
        matched=matched.replace("_", " ") if found else None,
        order=SEARCH_ORDER,
    )


@router.get("/effects", response_class=HTMLResponse)
def state_list(
    request: Request,
    conn: Conn,
    token: Session,
    settings: SettingsDep,
    state: Annotated[str, Query(max_length=20)],
    endpoint: Annotated[str | None, Query(max_length=200)] = None,
    cursor: Cursor = None,
    n: Position = 1,
) -> HTMLResponse:
    """A state's effects (the overview's tiles lead here), newest first: per endpoint,
    their repeated reasons grouped, then the effects a page at a time."""
    flt = _state_filter(state, endpoint.replace("\x00", "") if endpoint else None)
    mask = masked_for(token, settings)
    page = audit.search(conn, flt, limit=PAGE, cursor=cursor, mask=mask)
    query = {"state": state} | ({"endpoint": flt.endpoint} if flt.endpoint else {})
    reasons = lists.errors_grouped(conn, flt, mask=mask) if state in ("dead", "uncertain") else []
    return render(
        request,
        "list.html",
        token=token,
        flt=flt,
        page=page,
        pager=_pager(page, lists.count(conn, flt), n, "/ui/effects?" + urlencode(query)),
        per_endpoint=lists.by_endpoint(conn, flt),
        reasons=reasons,
        any_age=flt.since is None,
        days=MAX_RANGE_DAYS,
    )


def _state_filter(state: str, endpoint: str | None) -> EffectFilter:
    """A work state at any age; delivered and cancelled (history) the last 31 days."""
    if state in WORK_STATES or state not in EFFECT_STATES:  # an unknown one: build_filter's 422
        return build_filter(since=None, until=None, state=state, endpoint=endpoint)
    until = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)
    since = until - dt.timedelta(days=MAX_RANGE_DAYS)
    return build_filter(since=since, until=until, state=state, endpoint=endpoint)


@router.get("/held", response_class=HTMLResponse)
def held(request: Request, conn: Conn, token: Session) -> HTMLResponse:
    """The batches the volume guard holds, and their waiting effects per endpoint."""
    return render(
        request,
        "held.html",
        token=token,
        batches=holds.held_batches(conn, limit=MAX_PAGE),
        per_endpoint=lists.held_by_endpoint(conn),
    )


@router.get("/batch", response_class=HTMLResponse)
def batch(
    request: Request,
    conn: Conn,
    token: Session,
    settings: SettingsDep,
    job: Annotated[str, Query(min_length=1, max_length=200)],
    batch_id: Annotated[str, Query(min_length=1, max_length=1000)],
    cursor: Cursor = None,
    n: Position = 1,
    rejects_cursor: Cursor = None,
) -> HTMLResponse:
    """A batch (any id: it travels as a query parameter), its reconciliation, its
    effects and its rejects (reasons grouped, then each), a keyset page at a time."""
    job, batch_id = job.replace("\x00", ""), batch_id.replace("\x00", "")
    recon = reconcile.batch(conn, job, batch_id)
    mask = masked_for(token, settings)
    flt = build_filter(since=None, until=None, job=job, batch_id=batch_id)
    page = audit.search(conn, flt, limit=PAGE, cursor=cursor, mask=mask)
    refused = rejects.of_batch(conn, job, batch_id, limit=PAGE, cursor=rejects_cursor)
    more_rejects = refused.next_cursor and batch_url(
        job, batch_id, rejects_cursor=refused.next_cursor
    )
    return render(
        request,
        "batch.html",
        token=token,
        batch=(detail := audit.batch_detail(conn, job, batch_id)),
        recon=recon,
        page=page,
        pager=_pager(page, lists.count(conn, flt), n, batch_url(job, batch_id)),
        reasons=lists.reject_reasons(conn, job, batch_id, mask=mask),
        rejects=[rejects.masked(r, mask) for r in refused.items],
        rejects_total=detail.live["rejects"],
        more_rejects=more_rejects,
        first_rejects=batch_url(job, batch_id) if rejects_cursor else None,
    )


@router.get("/uncertain", response_class=HTMLResponse)
def uncertain_page(
    request: Request, conn: Conn, token: Session, settings: SettingsDep
) -> HTMLResponse:
    """Effects whose send started with an unknown outcome (masked for support)."""
    found = uncertain.listed(conn, limit=MAX_PAGE, mask=masked_for(token, settings))
    return render(request, "uncertain.html", token=token, effects=found)
