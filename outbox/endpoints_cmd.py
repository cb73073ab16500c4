"""``outbox endpoints add|list|show|pause|resume``: the named destinations.

Pause and resume take a reason and are recorded in ``operator_actions`` (actor
``cli:<login>``), as the API's operator routes are.

A webhook's signing secret is printed once, on creation, and never again.
SMTP passwords are read from an environment variable, never from the command
line (where ``ps`` would show them).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
from collections.abc import Callable
from typing import Any

from dispatcher import db, endpoints, operations
from dispatcher.errors import ConfigurationError
from dispatcher.settings import Settings
from outbox.database import database_url


def register(sub: Any) -> None:
    p = sub.add_parser("endpoints", help="register, list, pause and resume endpoints")
    cmds = p.add_subparsers(dest="endpoints_command", required=True, metavar="ACTION")
    add = cmds.add_parser("add", help="register an endpoint")
    kinds = add.add_subparsers(dest="kind", required=True, metavar="KIND")
    hook = kinds.add_parser("webhook", help="an HTTP endpoint, signed (Standard Webhooks)")
    hook.add_argument("name")
    hook.add_argument("--url", required=True)
    hook.add_argument("--secret", help="whsec_... (default: generated and printed once)")
    _policy_args(hook)
    hook.set_defaults(handler=add_webhook)
    mail = kinds.add_parser("email", help="an SMTP server and From address")
    mail.add_argument("name")
    mail.add_argument("--smtp-host", required=True)
    mail.add_argument("--smtp-port", type=int, required=True)
    mail.add_argument("--mail-from", required=True)
    mail.add_argument("--smtp-tls", choices=["none", "starttls", "tls"], default="none")
    mail.add_argument("--smtp-username")
    mail.add_argument("--smtp-password-env", help="name of an env variable holding the password")
    mail.add_argument(
        "--smtp-allow-plaintext-auth",
        action="store_true",
        help="allow AUTH with --smtp-tls none (a trusted local relay only; default: refused)",
    )
    _policy_args(mail)
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


def _policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--retry-schedule", help="delays in seconds, e.g. 0,5,300,1800")
    p.add_argument("--rate-limit-per-s", type=float)
    p.add_argument("--json", action="store_true")


def _schedule(raw: str | None) -> list[float] | None:
    if not raw:
        return None
    try:
        return [float(x) for x in raw.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigurationError(
            f"--retry-schedule {raw!r}: give seconds separated by commas, e.g. 0,5,300"
        ) from exc


def _print(endpoint: endpoints.Endpoint, as_json: bool, secret: str | None = None) -> None:
    data = endpoint.public()
    if secret is not None:
        data["signing_secret"] = secret
    if as_json:
        print(json.dumps(data, default=str))
        return
    for name, value in data.items():
        print(f"{name:18} {value}")
    if secret is not None:
        print("\nKeep the signing secret now: it is not shown again.")


def _engine(settings: Settings) -> Any:
    return db.create_engine(database_url(settings), pool_size=1)


def add_webhook(args: argparse.Namespace, settings: Settings) -> int:
    engine = _engine(settings)
    try:
        with engine.begin() as conn:
            endpoint, secret = endpoints.add_webhook(
                conn,
                name=args.name,
                url=args.url,
                signing_secret=args.secret,
                timeout_s=args.timeout_s,
                retry_schedule_s=_schedule(args.retry_schedule),
                rate_limit_per_s=args.rate_limit_per_s,
            )
    finally:
        engine.dispose()
    _print(endpoint, args.json, secret=None if args.secret else secret)
    return 0


def add_email(args: argparse.Namespace, settings: Settings) -> int:
    password = None
    if args.smtp_password_env:
        password = os.environ.get(args.smtp_password_env)
        if password is None:
            raise ConfigurationError(
                f"--smtp-password-env {args.smtp_password_env}: that variable is not set"
            )
    engine = _engine(settings)
    try:
        with engine.begin() as conn:
            endpoint = endpoints.add_email(
                conn,
                name=args.name,
                smtp_host=args.smtp_host,
                smtp_port=args.smtp_port,
                mail_from=args.mail_from,
                smtp_tls=args.smtp_tls,
                smtp_username=args.smtp_username,
                smtp_password=password,
                smtp_allow_plaintext_auth=args.smtp_allow_plaintext_auth,
                timeout_s=args.timeout_s,
                retry_schedule_s=_schedule(args.retry_schedule),
                rate_limit_per_s=args.rate_limit_per_s,
            )
    finally:
        engine.dispose()
    _print(endpoint, args.json)
    return 0


def list_endpoints(args: argparse.Namespace, settings: Settings) -> int:
    engine = _engine(settings)
    try:
        with engine.connect() as conn:
            found = endpoints.list_all(conn)
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps([e.public() for e in found], default=str))
        return 0
    for e in found:
        state = "enabled" if e.enabled else f"paused ({e.paused_reason})"
        print(f"{e.name:24} {e.kind:8} {e.url or f'{e.smtp_host}:{e.smtp_port}':40} {state}")
    return 0


def show_endpoint(args: argparse.Namespace, settings: Settings) -> int:
    engine = _engine(settings)
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
    engine = _engine(settings)
    try:
        with engine.begin() as conn:
            action(conn, name, actor=f"cli:{getpass.getuser()}", reason=reason)
    finally:
        engine.dispose()
    print(f"{done} {name}")
    return 0
