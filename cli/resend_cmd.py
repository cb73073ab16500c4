"""``outbox effects resend``: send a delivered (or dead) effect again, same key
(docs/operations.md, "Resending").

One effect by its key (or the start of one, as ``effects list`` prints it: it must
name exactly one effect), or many by a filter (a batch; an endpoint within
``--since``/``--until``; a recipient; a reference), capped (``--cap``) and counted
first with ``--dry-run``. Needs ``--reason``; recorded in ``operator_actions``
(actor ``cli:<login>``) as the API's routes are. A refusal (not delivered or dead,
erased, purged, an archived endpoint, over the cap) exits with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.cli.filter_args import instant
from spark_outbox.cli.lookup_cmd import one_key
from spark_outbox.console import resend
from spark_outbox.console.filters import build_filter
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings


def register(cmds: Any) -> None:
    p = cmds.add_parser(
        "resend",
        help="send a delivered or dead effect again, same key (one, or many by a filter)",
    )
    p.add_argument(
        "key",
        nargs="?",
        help="the idempotency key (64 hex, or its printed start naming one effect); or a filter",
    )
    p.add_argument(
        "--job", help="with --batch-id: every resendable effect of one batch (default: none)"
    )
    p.add_argument("--batch-id", help="batch id, needs --job (default: none)")
    p.add_argument(
        "--endpoint", help="an endpoint's effects, within --since/--until (default: none)"
    )
    p.add_argument("--recipient", help="a recipient's effects, exact (default: none)")
    p.add_argument("--reference", help="a business reference's effects, exact (default: none)")
    p.add_argument("--state", choices=resend.RESENDABLE, help="only these (default: both)")
    p.add_argument("--since", help="created at or after, ISO 8601 with a zone (default: none)")
    p.add_argument("--until", help="created before, ISO 8601 with a zone (default: none)")
    p.add_argument(
        "--cap", type=int, default=1000, help="a filter: refuse if more match (default 1000)"
    )
    p.add_argument("--reason", required=True, help="why (kept in the operator actions)")
    p.add_argument("--dry-run", action="store_true", help="count and check; change nothing")
    p.add_argument("--json", action="store_true", help="the result as one JSON object")
    p.set_defaults(handler=resend_effects)


_FILTERS = ("job", "batch_id", "endpoint", "recipient", "reference", "state", "since", "until")


def resend_effects(args: argparse.Namespace, settings: Settings) -> int:
    by_filter = any(getattr(args, name) is not None for name in _FILTERS)
    if (args.key is None) == (not by_filter):
        raise ConfigurationError(
            "resend: give an idempotency key, or a filter (--job with --batch-id, --endpoint "
            "with --since/--until, --recipient, --reference): one of the two"
        )
    engine = engine_for(settings)
    try:
        with engine.begin() as conn:
            if args.key is not None:
                key = one_key(conn, args.key)
                done = resend.resend(
                    conn, key, actor=cli_actor(), reason=args.reason, dry_run=args.dry_run
                )
            else:
                done = resend.bulk_resend(
                    conn,
                    _filter(args),
                    cap=args.cap,
                    actor=cli_actor(),
                    reason=args.reason,
                    dry_run=args.dry_run,
                )
    finally:
        engine.dispose()
    if args.json:
        print(json.dumps(dataclasses.asdict(done) | {"over_cap": done.over_cap}))
    else:
        _say(done)
    return 0


def _filter(args: argparse.Namespace) -> Any:
    return build_filter(
        since=instant("since", args.since),
        until=instant("until", args.until),
        job=args.job,
        batch_id=args.batch_id,
        endpoint=args.endpoint,
        recipient=args.recipient,
        reference=args.reference,
        state=args.state,
    )


def _say(done: resend.Resend) -> None:
    if done.dry_run:
        more = "more than " if done.over_cap else ""
        print(
            f"dry run: {more}{done.cap if done.over_cap else done.matched} effect(s) of "
            f"{done.target} would be sent again, same key; nothing changed"
        )
        if done.over_cap:
            print(f"  over --cap {done.cap}: the resend would be refused; narrow it or raise --cap")
    else:
        print(
            f"{done.resent} effect(s) of {done.target} will be sent again, same key "
            f"(operator action {done.action_id})"
        )
    if done.paused:
        print(f"  {done.paused} wait for a paused endpoint: resume it (outbox endpoints resume)")
    for why, n in sorted(done.refused.items()):
        print(f"  not resent ({n}): {why}")
