"""``outbox endpoints add|list|show|pause|resume`` (and, from ``endpoints_change_cmd``,
``update|rotate-secret|recover``, from ``endpoints_archive_cmd``, ``archive|unarchive``):
the named destinations.

Every change (add, pause, resume, update, rotate-secret, recover, archive, unarchive) is
recorded in
``operator_actions`` (actor ``cli:<login>``), as the API's operator routes are.

A webhook's signing secret is printed once, on creation, and never again.
Secrets come from standard input (``--secret-stdin``, ``--smtp-password-stdin``:
the first line) or from a named environment variable (``--secret-env``,
``--smtp-password-env``), not from the command line, where ``ps`` shows them
to every user; ``--secret VALUE`` still works for old scripts and says so.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from spark_outbox.cli import endpoints_archive_cmd, endpoints_change_cmd, output
from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.cli.endpoints_change_cmd import read_secret, schedule
from spark_outbox.console import admin, operations
from spark_outbox.core import endpoints
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import ssrf

ADD_REASON = "registered with outbox endpoints add"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "endpoints", help="register, list, change, pause, resume and recover endpoints"
    )
    cmds = p.add_subparsers(dest="endpoints_command", required=True, metavar="ACTION")
    add = cmds.add_parser("add", help="register an endpoint")
    kinds = add.add_subparsers(dest="kind", required=True, metavar="KIND")
    hook = kinds.add_parser("webhook", help="an HTTP endpoint, signed (Standard Webhooks)")
    hook.add_argument("name")
    hook.add_argument("--url", required=True)
    given = hook.add_mutually_exclusive_group()
    given.add_argument("--secret-stdin", action="store_true", help="read whsec_... from stdin")
    given.add_argument(
        "--secret-env",
        metavar="VAR",
        help="an env variable holding whsec_... (default: a new secret is generated)",
    )
    given.add_argument(
        "--secret",
        help="whsec_... (visible to ps: prefer --secret-stdin; default: a new secret)",
    )
    _policy_args(hook)
    _deduplicates_arg(hook, True)
    hook.set_defaults(handler=add_webhook)
    mail = kinds.add_parser("email", help="an SMTP server and From address")
    mail.add_argument("name")
    mail.add_argument("--smtp-host", required=True)
    mail.add_argument("--smtp-port", type=int, required=True)
    mail.add_argument("--mail-from", required=True)
    mail.add_argument(
        "--smtp-tls", choices=["none", "starttls", "tls"], default="none", help="transport security"
    )
    mail.add_argument("--smtp-username", help="SMTP login (default: none, no AUTH)")
    password = mail.add_mutually_exclusive_group()
    password.add_argument(
        "--smtp-password-stdin", action="store_true", help="read the password from stdin"
    )
    password.add_argument(
        "--smtp-password-env",
        metavar="VAR",
        help="name of an env variable holding the password (default: none)",
    )
    mail.add_argument(
        "--smtp-allow-plaintext-auth",
        action="store_true",
        help="allow AUTH with --smtp-tls none (a trusted local relay only; default: refused)",
    )
    _policy_args(mail)
    _deduplicates_arg(mail, False)
    mail.set_defaults(handler=add_email)
    ls = cmds.add_parser("list", help="every endpoint (no secrets)")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(handler=list_endpoints)
    show = cmds.add_parser("show", help="one endpoint (no secrets)")
    show.add_argument("name")
    show.set_defaults(handler=show_endpoint)
    pause = cmds.add_parser("pause", help="stop delivering to it; effects stay pending")
    pause.add_argument("name")
    pause.add_argument("--reason", required=True)
    pause.set_defaults(handler=pause_endpoint)
    resume = cmds.add_parser("resume", help="deliver to it again")
    resume.add_argument("name")
    resume.add_argument("--reason", required=True)
    resume.set_defaults(handler=resume_endpoint)
    endpoints_change_cmd.register(cmds)
    endpoints_archive_cmd.register(cmds)


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout-s", type=float, default=10.0, help="seconds one send may take")
    p.add_argument(
        "--retry-schedule",
        help="delays in seconds, e.g. 0,5,300,1800 (default: the dispatcher's "
        "$OUTBOX_RETRY_SCHEDULE_S)",
    )
    p.add_argument(
        "--rate-limit-per-s",
        type=float,
        help="sends per second, all dispatchers together (default: no limit)",
    )
    p.add_argument(
        "--max-in-flight",
        type=int,
        help="sends in flight at once, all dispatchers together (default: no limit)",
    )
    p.add_argument(
        "--ordered",
        action="store_true",
        help="per-key ordering: an effect waits for earlier ones with its ordering_key "
        "(default: off)",
    )
    p.add_argument("--reason", default=ADD_REASON, help=f"for the audit (default {ADD_REASON!r})")
    p.add_argument("--json", action="store_true")


def _deduplicates_arg(p: argparse.ArgumentParser, default: bool) -> None:
    p.add_argument(
        "--deduplicates",
        action=argparse.BooleanOptionalAction,
        default=default,
        help="the receiver honours the idempotency key (webhook-id / Message-ID); "
        "--no-deduplicates: a send whose outcome is unknown becomes 'uncertain', not resent "
        f"(default: {'on' if default else 'off'})",
    )


def _print(endpoint: endpoints.Endpoint, as_json: bool, secret: str | None = None) -> None:
    data = endpoint.public()
    if secret is not None:
        data["signing_secret"] = secret
    if as_json:
        print(output.dumps(data))
        return
    for name, value in data.items():
        print(f"{name:18} {output.cell(value)}")
    if secret is not None:
        print("\nKeep the signing secret now: it is not shown again.")


def add_webhook(args: argparse.Namespace, settings: Settings) -> int:
    given = read_secret("--secret", args.secret_stdin, args.secret_env)
    if given is None and args.secret is not None:
        if not args.secret.strip():
            raise ConfigurationError(
                "--secret: empty (an unset shell variable?); give whsec_..., "
                "or leave the option out and a secret is generated"
            )
        given = args.secret
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            endpoint, secret = admin.create_webhook(
                conn,
                actor=cli_actor(),
                reason=args.reason,
                name=args.name,
                url=args.url,
                signing_secret=given,
                timeout_s=args.timeout_s,
                retry_schedule_s=schedule(args.retry_schedule),
                rate_limit_per_s=args.rate_limit_per_s,
                max_in_flight=args.max_in_flight,
                ordered=args.ordered,
                deduplicates=args.deduplicates,
            )
    finally:
        engine.dispose()
    _print(endpoint, args.json, secret=None if given else secret)
    _warn_if_refused(endpoint.name, args.url, settings)
    return 0


def _warn_if_refused(name: str, url: str, settings: Settings) -> None:
    """Trying it locally: a receiver on 127.0.0.1 or a private network is refused by the
    SSRF guard at send time (a dead letter); say so now, with the setting that allows it.
    Judged with this shell's OUTBOX_SSRF_ALLOW_NETWORKS, which the dispatcher should share."""
    host = urlsplit(url).hostname or ""
    for address, reason in ssrf.refused_addresses(host, settings.ssrf_allow_networks):
        network = f"{address}/{address.max_prefixlen}"
        print(
            f"outbox: warning: endpoint {name!r}: {host} is {address}, a {reason} address. "
            "The dispatcher refuses it (SSRF guard) and dead-letters its effects unless it "
            f"runs with OUTBOX_SSRF_ALLOW_NETWORKS={network} (or a wider network that "
            "holds it); for a local try, e.g. "
            f"`OUTBOX_SSRF_ALLOW_NETWORKS={network} outbox dispatcher run`",
            file=sys.stderr,
        )


def add_email(args: argparse.Namespace, settings: Settings) -> int:
    password = read_secret("--smtp-password", args.smtp_password_stdin, args.smtp_password_env)
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            endpoint = admin.create_email(
                conn,
                actor=cli_actor(),
                reason=args.reason,
                name=args.name,
                smtp_host=args.smtp_host,
                smtp_port=args.smtp_port,
                mail_from=args.mail_from,
                smtp_tls=args.smtp_tls,
                smtp_username=args.smtp_username,
                smtp_password=password,
                smtp_allow_plaintext_auth=args.smtp_allow_plaintext_auth,
                timeout_s=args.timeout_s,
                retry_schedule_s=schedule(args.retry_schedule),
                rate_limit_per_s=args.rate_limit_per_s,
                max_in_flight=args.max_in_flight,
                ordered=args.ordered,
                deduplicates=args.deduplicates,
            )
    finally:
        engine.dispose()
    _print(endpoint, args.json)
    return 0


def list_endpoints(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            found = endpoints.list_all(conn)
    finally:
        engine.dispose()
    if args.json:
        print(output.dumps([e.public() for e in found]))
        return 0
    for e in found:
        state = "enabled" if e.enabled else f"paused ({e.paused_reason})"
        state = "archived" if e.archived_at else state
        dedup = "deduplicates" if e.deduplicates else "no-dedup"
        where = e.url or f"{e.smtp_host}:{e.smtp_port}"
        name, where, state = (output.cell(v) for v in (e.name, where, state))  # escaped
        print(f"{name:24} {e.kind:8} {where:40} {dedup:12} {state}")
    return 0


def show_endpoint(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            endpoint = endpoints.get(conn, args.name)
    finally:
        engine.dispose()
    _print(endpoint, as_json=True)
    return 0


def pause_endpoint(args: argparse.Namespace, settings: Settings) -> int:
    return _operate(settings, operations.pause_endpoint, args.name, args.reason, "paused")


def resume_endpoint(args: argparse.Namespace, settings: Settings) -> int:
    return _operate(settings, operations.resume_endpoint, args.name, args.reason, "resumed")


def _operate(
    settings: Settings, action: Callable[..., None], name: str, reason: str, done: str
) -> int:
    """Pause or resume, with its ``operator_actions`` row in the same transaction."""
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            action(conn, name, actor=cli_actor(), reason=reason)
    finally:
        engine.dispose()
    print(f"{done} {name}")
    return 0
