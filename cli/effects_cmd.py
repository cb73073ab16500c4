"""``outbox effects list|show`` and ``outbox rejects list|requeue``: find things without psql
(``effects uncertain|resolve|requeue`` live in modules of their own).

The same read model as the API (``spark_outbox.console.audit``, ``spark_outbox.console.rejects``)
and the same search rules: a batch's effects (``--job`` + ``--batch-id``) need
no time window; other searches cover ``--since`` .. ``--until``, at most 31
days (by default the 31 days before now). The CLI holds database credentials,
so it shows payloads and raw rows unmasked, as the API does for operators.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from typing import Any

from spark_outbox.cli import lookup_cmd, output, requeue_cmd, resend_cmd, uncertain_cmd
from spark_outbox.cli.database import cli_actor, database_url
from spark_outbox.cli.filter_args import instant
from spark_outbox.console import audit, lists, rejects
from spark_outbox.console.filters import (
    MAX_PAGE,
    MAX_RANGE_DAYS,
    EffectFilter,
    InvalidFilter,
    build_filter,
)
from spark_outbox.core import db
from spark_outbox.core.settings import Settings

LIST_COLUMNS = ("created_at", "state", "attempts", "endpoint", "recipient", "reference")
LIST_COLUMNS += ("idempotency_key",)
LIST_FIELDS = tuple(c.replace("attempts", "attempt_count") for c in LIST_COLUMNS)


def register(sub: Any) -> None:
    p = sub.add_parser("effects", help="list and show effects (the delivery audit)")
    cmds = p.add_subparsers(dest="effects_command", required=True, metavar="ACTION")
    ls = cmds.add_parser("list", help="effects matching a filter, newest first")
    ls.add_argument("--job", help="job name (default: any; with --batch-id: one batch, no window)")
    ls.add_argument("--batch-id", help="batch id, needs --job (default: any)")
    ls.add_argument("--endpoint", help="endpoint name (default: any)")
    ls.add_argument("--recipient", help="recipient, exact, any age (default: any)")
    ls.add_argument(
        "--reference", help="business reference (an invoice number), exact, any age (default: any)"
    )
    ls.add_argument(
        "--key-prefix",
        help="the start of a key as reports print it (8+ hex, e.g. 13dd1f9d44fa…; default: any)",
    )
    ls.add_argument(
        "--state",
        help="pending, leased, delivered, dead, cancelled, uncertain or expired (default: any)",
    )
    ls.add_argument(
        "--since",
        help=f"ISO 8601 with a zone (default: {MAX_RANGE_DAYS} days before --until for a broad "
        "search; none for a batch, a recipient, a reference, a key prefix or a work state)",
    )
    ls.add_argument("--until", help="ISO 8601 with a zone, exclusive (default: now)")
    _page_args(ls)
    ls.set_defaults(handler=list_effects)
    show = cmds.add_parser("show", help="one effect: payload, attempts, its batch")
    show.add_argument(
        "key", help="the idempotency key (64 hex), or its start as printed (13dd1f9d44fa…)"
    )
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(handler=show_effect)
    uncertain_cmd.register(cmds)
    lookup_cmd.register(cmds)
    resend_cmd.register(cmds)
    requeue_cmd.register(cmds)

    r = sub.add_parser("rejects", help="rows a batch refused, with the reasons")
    rcmds = r.add_subparsers(dest="rejects_command", required=True, metavar="ACTION")
    rls = rcmds.add_parser("list", help="a batch's rejects, newest first")
    rls.add_argument("--job", required=True, help="job name, e.g. billing")
    rls.add_argument("--batch-id", required=True, help="batch id, e.g. 2026-01-01")
    _page_args(rls)
    rls.set_defaults(handler=list_rejects)
    rq = rcmds.add_parser(
        "requeue",
        help="enqueue again a batch's effects refused for naming an unregistered endpoint "
        "(register it first); other rejects stay rejects",
    )
    rq.add_argument("job", help="job name, e.g. billing")
    rq.add_argument("batch_id", help="batch id, e.g. 2026-01-01")
    rq.add_argument("--reason", required=True, help="why (kept in the operator actions)")
    rq.add_argument("--dry-run", action="store_true", help="count what it would do; write nothing")
    rq.add_argument(
        "--cap", type=int, default=1000, help="refuse when more rejects match (default 1000)"
    )
    rq.add_argument("--json", action="store_true", help="the result as one JSON object")
    rq.set_defaults(handler=requeue_rejects)


def _page_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--limit", type=int, default=100, help=f"page size, 1..{MAX_PAGE}")
    p.add_argument("--cursor", help="next_cursor of the previous page (default: first page)")
    p.add_argument("--json", action="store_true", help="print the page as JSON (as the API)")


def _filter(args: argparse.Namespace) -> EffectFilter:
    """The search's filter; a broad one without a window gets the last 31 days."""
    given = {
        "job": args.job,
        "batch_id": args.batch_id,
        "endpoint": args.endpoint,
        "recipient": args.recipient,
        "reference": args.reference,
        "key_prefix": args.key_prefix,
        "state": args.state,
    }
    since, until = instant("since", args.since), instant("until", args.until)
    if since is None and until is None:
        try:
            return build_filter(since=None, until=None, **given)
        except InvalidFilter as exc:
            if exc.field != "since":
                raise
    until = until or dt.datetime.now(dt.UTC)
    return build_filter(since=since or _days_before(until), until=until, **given)


def _days_before(until: dt.datetime) -> dt.datetime:
    """The default --since: MAX_RANGE_DAYS before --until, or the earliest instant
    (``--until 0001-01-05T00:00:00Z`` once overflowed into a traceback)."""
    try:
        return until - dt.timedelta(days=MAX_RANGE_DAYS)
    except OverflowError:
        return dt.datetime.min.replace(tzinfo=dt.UTC)


def _connect(settings: Settings) -> Any:
    return db.create_engine(database_url(settings), pool_size=1)


def list_effects(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.api.schemas import EffectPagePublic

    flt = _filter(args)
    engine = _connect(settings)
    try:
        with engine.connect() as conn:
            page = audit.search(conn, flt, limit=args.limit, cursor=args.cursor)
            total = lists.count(conn, flt) if page.next_cursor or args.cursor else None
    finally:
        engine.dispose()
    if args.json:
        output.as_json(EffectPagePublic, page)
    else:
        output.table(LIST_COLUMNS, ([getattr(e, c) for c in LIST_FIELDS] for e in page.items))
    if total is not None:  # the page is not the whole list: say how much is left out
        sys.stdout.flush()
        print(f"showing {len(page.items)} of {total}", file=sys.stderr)
    output.more(page.next_cursor)
    return 0


def show_effect(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.api.schemas import EffectDetailPublic

    engine = _connect(settings)
    try:
        with engine.connect() as conn:
            detail = audit.effect_detail(conn, lookup_cmd.one_key(conn, args.key))
    finally:
        engine.dispose()
    if args.json:
        output.as_json(EffectDetailPublic, detail)
        return 0
    e = detail.effect
    produced = f"{e.job} / {e.batch_id}" if e.job else "enqueue()"
    asked = detail.resend
    resend = (
        asked and f"by {asked.actor} at {output.cell(asked.at)} (action {asked.id}): {asked.reason}"
    )
    for name, value in (
        ("idempotency_key", e.idempotency_key),
        ("state", e.state),
        ("endpoint", e.endpoint),
        ("recipient", e.recipient),
        ("reference", e.reference),
        ("attempts", e.attempt_count),
        ("created_at", e.created_at),
        ("delivered_at", e.delivered_at),
        ("next_attempt_at", e.next_attempt_at),
        ("send_by", e.expires_at),
        # Erased or purged: the payload and personal fields are gone, the summary stays.
        ("purged_at", e.purged_at),
        ("last_error", e.last_error),
        ("resend", resend),
        ("produced by", produced),
        ("payload", e.payload),
    ):
        print(f"{name:16} {output.cell(value)}")
    if detail.attempts:
        print()
        output.table(
            ("#", "started_at", "outcome", "status", "ms", "resend", "error"),
            (_attempt_row(a) for a in detail.attempts),
        )
    return 0


def _attempt_row(a: audit.Attempt) -> tuple[object, ...]:
    by = a.resend_by and f"by {a.resend_by} (action {a.resend_action_id})"
    return (a.attempt, a.started_at, a.outcome, a.status_code, f"{a.duration_ms:.0f}", by, a.error)


def list_rejects(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.api.schemas import RejectPagePublic

    engine = _connect(settings)
    try:
        with engine.connect() as conn:
            page = rejects.of_batch(
                conn, args.job, args.batch_id, limit=args.limit, cursor=args.cursor
            )
    finally:
        engine.dispose()
    if args.json:
        output.as_json(RejectPagePublic, page)
        return 0
    output.table(
        ("rejected_at", "reason", "raw_row"),
        ((r.rejected_at, r.reason, r.raw_row) for r in page.items),
    )
    output.more(page.next_cursor)
    return 0


def requeue_rejects(args: argparse.Namespace, settings: Settings) -> int:
    engine = _connect(settings)
    try:
        with engine.begin() as conn:
            done = rejects.requeue(
                conn,
                args.job,
                args.batch_id,
                actor=cli_actor(),
                reason=args.reason,
                dry_run=args.dry_run,
                cap=args.cap,
            )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(dataclasses.asdict(done) | {"over_cap": done.over_cap}))
        return 1 if done.over_cap else 0
    where = f"{done.job} / {done.batch_id}"
    if done.over_cap:
        print(
            f"more than {done.cap} rejects of {where} name an unregistered endpoint; "
            "nothing changed: raise --cap"
        )
        return 1
    if done.matched == 0:
        print(f"no rejects of {where} name an unregistered endpoint (or all were requeued)")
        return 0
    verb = "would enqueue" if done.dry_run else "enqueued"
    print(
        f"{'dry run: ' if done.dry_run else ''}{done.matched} reject(s) of {where} named an "
        f"unregistered endpoint: {verb} {done.enqueued}, {done.known} already known"
        + ("; nothing changed" if done.dry_run else "")
    )
    for reason, n in sorted(done.still_refused.items()):
        print(f"  still refused ({n}): {reason}")
    return 0
