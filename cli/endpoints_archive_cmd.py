"""``outbox endpoints archive|unarchive``: retire an endpoint, keeping its history.

An archived endpoint accepts no new effects (``enqueue`` and the Spark sink refuse
them, naming it) and no dispatcher sends for it; its effects stay searchable.
Archiving refuses while effects are pending unless ``--cancel-pending``
(``spark_outbox.console.lifecycle``). Each is one transaction with its
``operator_actions`` row (actor ``cli:<login>``).
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import lifecycle
from spark_outbox.core.settings import Settings


def register(cmds: Any) -> None:
    arc = cmds.add_parser(
        "archive", help="retire it: no new effects, nothing sent, history kept and searchable"
    )
    arc.add_argument("name")
    arc.add_argument(
        "--cancel-pending",
        action="store_true",
        help="cancel its pending effects with the archive (default: refuse while any are pending)",
    )
    arc.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    arc.set_defaults(handler=archive)
    unarc = cmds.add_parser("unarchive", help="accept effects for it again")
    unarc.add_argument("name")
    unarc.add_argument("--reason", required=True, help="why (kept in the audit trail)")
    unarc.set_defaults(handler=unarchive)


def archive(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            done = lifecycle.archive(
                conn,
                args.name,
                cancel_pending=args.cancel_pending,
                actor=cli_actor(),
                reason=args.reason,
            )
    finally:
        engine.dispose()
    cancelled = f", {done.cancelled} pending effect(s) cancelled" if done.cancelled else ""
    print(f"archived {done.endpoint}{cancelled}; `outbox endpoints unarchive` undoes it")
    return 0


def unarchive(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            ep = lifecycle.unarchive(conn, args.name, actor=cli_actor(), reason=args.reason)
    finally:
        engine.dispose()
    state = "enabled" if ep.enabled else f"still paused ({ep.paused_reason})"
    print(f"unarchived {ep.name}: {state}")
    return 0
