"""``outbox endpoints update|rotate-secret|recover``: change a registered endpoint.

Each is one transaction with its ``operator_actions`` row (actor ``cli:<login>``).
``rotate-secret`` prints the new secret once, on stdout; nothing else shows it.
A secret given to ``update`` (the SMTP password) or ``rotate-secret`` (a signing
secret of your own) comes from standard input or a named environment variable,
never from the command line, where ``ps`` shows it to every user.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from typing import Any

from spark_outbox.cli import output
from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import admin, operations
from spark_outbox.core.durations import describe_s, parse_duration_s
from spark_outbox.core.errors import ConfigurationError, InvalidRequest
from spark_outbox.core.settings import Settings

CLEAR = "none"


def register(cmds: Any) -> None:
    up = cmds.add_parser(
        "update",
        help="change any setting: URL, SMTP server, login, password, TLS, From, timeout, "
        "retry schedule, limits, ordering, deduplicates",
    )
    up.add_argument("name")
    up.add_argument("--url", help="a new webhook URL, checked as on add (default: unchanged)")
    up.add_argument("--timeout-s", type=float, help="seconds per send (default: unchanged)")
    up.add_argument("--retry-schedule", help=f"e.g. 0,5,300; {CLEAR!r}: the dispatcher's default")
    up.add_argument(
        "--rate-limit-per-s", help=f"sends per second; {CLEAR!r}: unlimited (default: unchanged)"
    )
    up.add_argument(
        "--max-in-flight", help=f"sends in flight; {CLEAR!r}: unlimited (default: unchanged)"
    )
    up.add_argument(
        "--ordered",
        choices=["on", "off"],
        help="per-key ordering by ordering_key (default: unchanged)",
    )
    up.add_argument(
        "--deduplicates",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the receiver honours the idempotency key; --no-deduplicates: unknown outcomes "
        "become 'uncertain', not resent (default: unchanged)",
    )
    _smtp_args(up)
    up.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    up.set_defaults(handler=update)
    rot = cmds.add_parser(
        "rotate-secret", help="new signing secret; the earlier ones overlap (keep signing)"
    )
    rot.add_argument("name")
    rot.add_argument(
        "--overlap",
        default="24h",
        help="how long the current secret keeps signing beside the new one (default 24h; "
        "0: none, and every earlier secret stops at once, e.g. after a leak)",
    )
    given = rot.add_mutually_exclusive_group()
    given.add_argument(
        "--secret-stdin", action="store_true", help="read the new whsec_... from stdin"
    )
    given.add_argument(
        "--secret-env",
        metavar="VAR",
        help="an env variable holding the new whsec_... (default: a new secret is generated)",
    )
    rot.add_argument("--reason", default="secret rotation", help="(default 'secret rotation')")
    rot.add_argument("--json", action="store_true", help="print one JSON object")
    rot.set_defaults(handler=rotate_secret)
    rec = cmds.add_parser("recover", help="requeue the endpoint's dead effects since a time")
    rec.add_argument("name")
    rec.add_argument("--since", required=True, help="ISO 8601 with a zone, or a duration ago: 3d")
    rec.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    rec.add_argument("--dry-run", action="store_true", help="only count (default: requeue)")
    rec.add_argument(
        "--cap", type=int, default=1000, help="refuse if more match (default 1000, at most 10000)"
    )
    rec.set_defaults(handler=recover)


def _smtp_args(up: argparse.ArgumentParser) -> None:
    """An e-mail endpoint's SMTP settings (checked together, as on add)."""
    up.add_argument("--smtp-host", help="SMTP server (default: unchanged)")
    up.add_argument("--smtp-port", type=int, help="(default: unchanged)")
    up.add_argument(
        "--smtp-tls",
        choices=["none", "starttls", "tls"],
        help="transport security (default: unchanged)",
    )
    up.add_argument("--smtp-username", help=f"SMTP login; {CLEAR!r}: no AUTH (default: unchanged)")
    password = up.add_mutually_exclusive_group()
    password.add_argument(
        "--smtp-password-stdin", action="store_true", help="read the new password from stdin"
    )
    password.add_argument(
        "--smtp-password-env",
        metavar="VAR",
        help="an env variable holding the new password (default: the password is kept)",
    )
    password.add_argument(
        "--clear-smtp-password", action="store_true", help="no password (default: unchanged)"
    )
    up.add_argument("--mail-from", help="the From address (default: unchanged)")
    up.add_argument(
        "--smtp-allow-plaintext-auth",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="allow AUTH with --smtp-tls none (a trusted local relay only; default: unchanged)",
    )


def read_secret(option: str, from_stdin: bool, env_name: str | None) -> str | None:
    """A secret from stdin's first line or a named environment variable (None: neither)."""
    if from_stdin:
        value = sys.stdin.readline().rstrip("\r\n")
        if not value:
            raise ConfigurationError(f"{option}-stdin: standard input is empty; pipe the value in")
        return value
    if env_name:
        value = os.environ.get(env_name)
        if value is None:
            raise ConfigurationError(f"{option}-env {env_name}: that variable is not set")
        if not value:
            raise ConfigurationError(f"{option}-env {env_name}: that variable is empty")
        return value
    return None


def schedule(raw: str | None) -> list[float] | None:
    if not raw or raw.strip().lower() == CLEAR:
        return None
    try:
        return [float(x) for x in raw.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigurationError(
            f"--retry-schedule {raw!r}: give seconds separated by commas, e.g. 0,5,300"
        ) from exc


def _changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if args.url is not None:
        changes["url"] = args.url
    if args.timeout_s is not None:
        changes["timeout_s"] = args.timeout_s
    if args.retry_schedule is not None:
        changes["retry_schedule_s"] = schedule(args.retry_schedule)
    if args.rate_limit_per_s is not None:
        changes["rate_limit_per_s"] = _limit("--rate-limit-per-s", args.rate_limit_per_s, float)
    if args.max_in_flight is not None:
        changes["max_in_flight"] = _limit("--max-in-flight", args.max_in_flight, int)
    if args.ordered is not None:
        changes["ordered"] = args.ordered == "on"
    if args.deduplicates is not None:
        changes["deduplicates"] = args.deduplicates
    return changes | _smtp_changes(args)


def _smtp_changes(args: argparse.Namespace) -> dict[str, Any]:
    changes: dict[str, Any] = {
        field: getattr(args, field)
        for field in ("smtp_host", "smtp_port", "smtp_tls", "mail_from")
        if getattr(args, field) is not None
    }
    if args.smtp_username is not None:
        user = args.smtp_username
        changes["smtp_username"] = None if user.strip().lower() == CLEAR else user
    password = read_secret("--smtp-password", args.smtp_password_stdin, args.smtp_password_env)
    if password is not None or args.clear_smtp_password:
        changes["smtp_password"] = password
    if args.smtp_allow_plaintext_auth is not None:
        changes["smtp_allow_plaintext_auth"] = args.smtp_allow_plaintext_auth
    return changes


def _limit(option: str, raw: str, kind: type[float] | type[int]) -> float | int | None:
    text = raw.strip().lower()
    try:
        return None if text == CLEAR else kind(text)
    except ValueError as exc:
        raise ConfigurationError(
            f"{option} {text!r}: give a number, or {CLEAR!r} for unlimited"
        ) from exc


def update(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            ep = admin.update_endpoint(
                conn, args.name, _changes(args), actor=cli_actor(), reason=args.reason
            )
    finally:
        engine.dispose()
    print(output.dumps(ep.public()))
    return 0


def rotate_secret(args: argparse.Namespace, settings: Settings) -> int:
    overlap_s = parse_duration_s("--overlap", args.overlap)
    given = read_secret("--secret", args.secret_stdin, args.secret_env)
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            done = admin.rotate_secret(
                conn,
                args.name,
                overlap_s=overlap_s,
                actor=cli_actor(),
                reason=args.reason,
                new_secret=given,
            )
    finally:
        engine.dispose()
    until = done.previous_valid_until
    if given is not None:  # the caller has it: never echoed
        old = f"until {until.isoformat()}" if until else "no longer"
        print(f"signing secret of {done.endpoint} replaced; the old one signs beside it {old}")
        return 0
    if args.json:
        print(
            json.dumps(
                {
                    "endpoint": done.endpoint,
                    "signing_secret": done.signing_secret,
                    "previous_valid_until": until.isoformat() if until else None,
                }
            )
        )
        return 0
    print(done.signing_secret)
    old = f"until {until.isoformat()} ({describe_s(overlap_s)})" if until else "no longer"
    print(
        f"new signing secret of {done.endpoint}: shown once, store it now; "
        f"the old one signs beside it {old}"
    )
    return 0


def since_arg(text: str, now: dt.datetime | None = None) -> dt.datetime:
    """``--since``: an ISO 8601 time with a zone, or a duration ago (``3d``)."""
    now = now or dt.datetime.now(dt.UTC)
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        return now - dt.timedelta(seconds=parse_duration_s("--since", text))
    if at.tzinfo is None:
        raise InvalidRequest("--since", "has no time zone", "append Z or an offset like +01:00")
    return at


def recover(args: argparse.Namespace, settings: Settings) -> int:
    since = since_arg(args.since)
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            done = operations.recover_endpoint(
                conn,
                args.name,
                since=since,
                cap=args.cap,
                dry_run=args.dry_run,
                actor=cli_actor(),
                reason=args.reason,
            )
    finally:
        engine.dispose()
    died = f"dead effect(s) of {args.name} that died since {output.cell(since)}"
    if not done.dry_run:
        print(f"requeued {done.requeued} {died}")
    elif done.over_cap:  # the true number is unknown
        print(f"more than {done.cap} {died}: a requeue would be refused; raise --cap")
    else:
        print(f"would requeue {done.matched} {died}")
    return 0
