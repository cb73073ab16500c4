"""``outbox effects requeue KEY --reason ... [--expires-at ...]``: a dead or expired
effect back to pending, due now, as the API's requeue does (recorded in
``operator_actions``, actor ``cli:<login>``).

An effect past its send-by time (every expired one) needs ``--expires-at``, a new
send-by time in the future: requeued without one it would only expire again
(docs/operations.md, "Send-by times"). Refusals exit with status 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.console import operations
from spark_outbox.core import timestamps
from spark_outbox.core.settings import Settings


def register(cmds: Any) -> None:
    rq = cmds.add_parser("requeue", help="a dead or expired effect: pending again, due now")
    rq.add_argument("key", help="the idempotency key (64 hex)")
    rq.add_argument("--reason", required=True, help="why (kept in the operator actions)")
    rq.add_argument(
        "--expires-at",
        help="a new send-by time, ISO 8601 with a zone (default: keep its own; needed once "
        "that has passed, as for every expired effect)",
    )
    rq.set_defaults(handler=requeue)


def requeue(args: argparse.Namespace, settings: Settings) -> int:
    expires_at = (
        None if args.expires_at is None else timestamps.parse("expires_at", args.expires_at)
    )
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            operations.requeue(
                conn, args.key, actor=cli_actor(), reason=args.reason, expires_at=expires_at
            )
    finally:
        engine.dispose()
    until = f", send-by time {args.expires_at}" if expires_at is not None else ""
    print(f"requeued {args.key}: pending, due now{until}")
    return 0
