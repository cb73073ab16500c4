"""``outbox tokens create|list|revoke``: API tokens; the plaintext is printed once.

Creation and revocation are recorded in ``operator_actions`` (actor ``cli:<login>``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from spark_outbox.cli import output
from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import admin, tokens
from spark_outbox.core.schema import ROLES
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("tokens", help="create, list and revoke API tokens")
    cmds = p.add_subparsers(dest="tokens_command", required=True, metavar="ACTION")
    create_p = cmds.add_parser("create", help="create a token and print it (once)")
    create_p.add_argument("--name", required=True, help="who holds it, e.g. alice")
    create_p.add_argument("--role", required=True, choices=ROLES)
    create_p.add_argument(
        "--json", action="store_true", help="print one JSON object (name, role, token)"
    )
    create_p.add_argument(
        "--reason", default="new token", help="for the audit trail (default 'new token')"
    )
    create_p.set_defaults(handler=create)
    list_p = cmds.add_parser("list", help="list tokens (never their values)")
    list_p.add_argument("--json", action="store_true", help="print JSON lines")
    list_p.set_defaults(handler=list_tokens)
    revoke_p = cmds.add_parser("revoke", help="revoke a token by name")
    revoke_p.add_argument("name")
    revoke_p.add_argument(
        "--reason", default="revoked", help="for the audit trail (default 'revoked')"
    )
    revoke_p.set_defaults(handler=revoke)


def create(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            token, plaintext = admin.create_token(
                conn, name=args.name, role=args.role, actor=cli_actor(), reason=args.reason
            )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps({"name": token.name, "role": token.role, "token": plaintext}))
    else:
        # Only the token on stdout, so TOKEN=$(outbox tokens create ...) captures it alone.
        print(plaintext, flush=True)
        print(f"token {token.name!r} ({token.role}): shown once; store it now", file=sys.stderr)
    return 0


def list_tokens(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            found = tokens.list_all(conn)
    finally:
        engine.dispose()
    for t in found:
        row = {
            "name": t.name,
            "role": t.role,
            "created_at": t.created_at.isoformat(),
            "last_used_at": t.last_used_at.isoformat() if t.last_used_at else None,
            "revoked_at": t.revoked_at.isoformat() if t.revoked_at else None,
        }
        if args.json:
            print(json.dumps(row))
        else:
            state = "revoked" if t.revoked_at else "live"
            name = output.cell(t.name)  # escaped: a name stored before names were checked
            print(f"{name:20} {t.role:9} {state:8} last used {row['last_used_at'] or 'never'}")
    return 0


def revoke(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            admin.revoke_token(conn, args.name, actor=cli_actor(), reason=args.reason)
    finally:
        engine.dispose()
    print(f"revoked {args.name}")
    return 0
