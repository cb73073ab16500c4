"""``outbox erase``: one person's data out of the outbox (docs/operations.md, "Erasure").

The person is given by exactly one of ``--recipient``, ``--reference`` or
``--payload-field PATH=VALUE``. ``--dry-run`` lists what would change and changes
nothing; without it the erasure runs in batches of ``--batch-size`` effects, each
its own short transaction, and is recorded in ``operator_actions`` (actor
``cli:<login>``, the reason with the person's value blanked). Exit status 0 when
all is erased, 3 when effects being sent right now were left (run the same
command again once their lease ended), 2 for refused input.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from spark_outbox.cli import output
from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import erasure, subjects
from spark_outbox.core.settings import Settings

INCOMPLETE = 3


def register(sub: Any) -> None:
    p = sub.add_parser("erase", help="erase one person's data (effects, attempts, rejects)")
    who = p.add_argument_group("the person (exactly one)")
    who.add_argument("--recipient", help="effects with this recipient, exactly (default: none)")
    who.add_argument(
        "--reference", help="effects with this business reference, exactly (default: none)"
    )
    who.add_argument(
        "--payload-field",
        metavar="PATH=VALUE",
        help="effects whose payload holds VALUE at dotted PATH, e.g. customer.id=42 "
        "(default: none)",
    )
    p.add_argument("--reason", required=True, help="why (kept in the operator actions)")
    p.add_argument("--dry-run", action="store_true", help="list what would change; change nothing")
    p.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        help=f"effects per transaction (default 1000, at most {erasure.MAX_BATCH_SIZE})",
    )
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(handler=erase)


def erase(args: argparse.Namespace, settings: Settings) -> int:
    who = subjects.person(
        recipient=args.recipient, reference=args.reference, payload_field=args.payload_field
    )
    engine = engine_for(settings)
    try:
        done = erasure.run(
            engine,
            who,
            actor=cli_actor(),
            reason=args.reason,
            dry_run=args.dry_run,
            batch_size=args.batch_size,
        )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(dataclasses.asdict(done) | {"complete": done.complete}))
    else:
        _describe(done)
    return 0 if done.complete else INCOMPLETE


def _describe(done: erasure.Erasure) -> None:
    if done.dry_run:
        output.table(
            ("idempotency_key", "endpoint", "state", "plan"),
            ((x.idempotency_key, x.endpoint, x.state, x.plan) for x in done.listed),
        )
        verb = "would be"
    else:
        verb = "were"
    print(
        f"{'dry run: ' if done.dry_run else ''}{done.effects} effect(s) of the person {verb} "
        f"erased ({done.cancelled} unsent, cancelled: never sent), {done.attempts} attempt(s) "
        f"blanked, {done.rejects} reject(s) blanked, {done.audit_rows} audit row(s) quoting "
        f"the value blanked"
    )
    if done.in_flight:
        print(
            f"{done.in_flight} effect(s) are being sent right now (or belong to a Spark run "
            "that has not committed) and were left: run the same erase again once they "
            "finished",
            file=sys.stderr,
        )
