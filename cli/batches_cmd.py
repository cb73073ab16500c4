"""``outbox batches held|release|cancel``: batches the volume guard held (spark_outbox.spark.guard).

``release`` lets a held batch's effects be claimed; ``cancel`` marks them
cancelled (nothing is sent, the keys stay known). Both need ``--reason``,
count first with ``--dry-run``, and are recorded in ``operator_actions``
(actor ``cli:<login>``), as the API's routes are.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import holds
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("batches", help="held batches: list, release or cancel them")
    cmds = p.add_subparsers(dest="batches_command", required=True, metavar="ACTION")
    held = cmds.add_parser("held", help="batches the volume guard holds, with the reasons")
    held.add_argument("--json", action="store_true", help="one JSON object per batch, per line")
    held.set_defaults(handler=list_held)
    for action, meaning in (
        ("release", "let a held batch's effects be delivered"),
        ("cancel", "cancel a held batch's effects: nothing of it is sent"),
    ):
        a = cmds.add_parser(action, help=meaning)
        a.add_argument("job")
        a.add_argument("batch_id")
        a.add_argument("--reason", required=True, help="why (kept in the operator actions)")
        a.add_argument(
            "--dry-run", action="store_true", help="only count the effects it would change"
        )
        a.add_argument("--json", action="store_true", help="the result as one JSON object")
        a.set_defaults(handler=decide, action=action)


def list_held(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            found = holds.held_batches(conn)
    finally:
        engine.dispose()
    for b in found:
        if args.json:
            print(json.dumps(b.__dict__, default=str))
        else:
            print(
                f"{b.job} / {b.batch_id}  committed {b.committed_at.isoformat()}  "
                f"{b.pending} effect(s) held: {b.hold_reason}"
            )
    if not found and not args.json:
        print("no held batches", file=sys.stderr)
    return 0


def decide(args: argparse.Namespace, settings: Settings) -> int:
    action = holds.release if args.action == "release" else holds.cancel
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            done = action(
                conn,
                args.job,
                args.batch_id,
                actor=cli_actor(),
                reason=args.reason,
                dry_run=args.dry_run,
            )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(done.__dict__))
    elif done.dry_run:
        print(
            f"dry run: {args.action} would change {done.effects} effect(s) of "
            f"{done.job} / {done.batch_id}; nothing changed"
        )
    else:
        verb = "released" if args.action == "release" else "cancelled"
        print(f"{verb} {done.effects} effect(s) of {done.job} / {done.batch_id}")
    return 0
