"""``outbox effects uncertain|resolve``: effects whose send started with an unknown
outcome (docs/dispatcher.md, "Uncertain sends"), and an operator's decision on them.

``resolve`` needs ``--reason``, can be tried with ``--dry-run``, and is recorded in
``operator_actions`` (actor ``cli:<login>``) as the API's route is. An effect that
is no longer uncertain (resolved meanwhile) is refused with exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from spark_outbox.cli import output
from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import uncertain
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings


def register(cmds: Any) -> None:
    ls = cmds.add_parser("uncertain", help="effects whose send started, outcome unknown")
    ls.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    ls.add_argument("--json", action="store_true", help="one JSON object per effect, per line")
    ls.set_defaults(handler=list_uncertain)
    res = cmds.add_parser(
        "resolve", help="an uncertain effect: mark it delivered, or send it again"
    )
    res.add_argument("key", nargs="?", help="the idempotency key (64 hex)")
    res.add_argument(
        "--endpoint", help="instead of KEY: every uncertain effect of this endpoint (default: none)"
    )
    res.add_argument(
        "--cap", type=int, default=1000, help="with --endpoint: refuse if more match (default 1000)"
    )
    what = res.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--mark-delivered",
        dest="action",
        action="store_const",
        const="mark_delivered",
        help="the receiver has it: delivered, recorded in the key ledger, nothing sent",
    )
    what.add_argument(
        "--send-again",
        dest="action",
        action="store_const",
        const="send_again",
        help="send it once more (the receiver may then have it twice)",
    )
    res.add_argument("--reason", required=True, help="why (kept in the operator actions)")
    res.add_argument("--dry-run", action="store_true", help="check only; change nothing")
    res.add_argument("--json", action="store_true", help="the result as one JSON object")
    res.set_defaults(handler=resolve)


def list_uncertain(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            found = uncertain.listed(conn, limit=args.limit)
    finally:
        engine.dispose()
    if args.json:
        for e in found:
            print(json.dumps(dataclasses.asdict(e), default=str))
        return 0
    output.table(
        ("send_started_at", "endpoint", "recipient", "idempotency_key", "last_error"),
        (
            (e.send_started_at, e.endpoint, e.recipient, e.idempotency_key, e.last_error)
            for e in found
        ),
    )
    if not found:
        print("no uncertain effects", file=sys.stderr)
    return 0


def resolve(args: argparse.Namespace, settings: Settings) -> int:
    if (args.key is None) == (args.endpoint is None):
        raise ConfigurationError("resolve: give an idempotency key or --endpoint NAME (one)")
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            if args.key is not None:
                done = uncertain.resolve(
                    conn,
                    args.key,
                    args.action,
                    actor=cli_actor(),
                    reason=args.reason,
                    dry_run=args.dry_run,
                )
            else:
                done = uncertain.resolve_endpoint(
                    conn,
                    args.endpoint,
                    args.action,
                    cap=args.cap,
                    actor=cli_actor(),
                    reason=args.reason,
                    dry_run=args.dry_run,
                )
    finally:
        engine.dispose()
    verb = "marked delivered" if done.action == "mark_delivered" else "sent again"
    if args.json:
        print(json.dumps(dataclasses.asdict(done)))
    elif done.dry_run:
        print(f"dry run: {done.effects} uncertain effect(s) of {done.target} would be {verb}")
    else:
        print(f"{done.effects} uncertain effect(s) of {done.target} {verb}")
    return 0
