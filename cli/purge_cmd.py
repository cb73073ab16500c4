"""``outbox purge --older-than 30d [--forget-keys-older-than 400d] [--dry-run]``:
retention, once, from the command line.

Finished effects (delivered, dead, cancelled) whose finish is older than the
cutoff are deleted with their attempts, in small batches
(dispatcher/dispatch/retention.py); their keys stay known in the key ledger,
which forgets keys that finished before its own horizon when one is given. The
same purge runs on a schedule inside a dispatcher when
``OUTBOX_RETENTION_OLDER_THAN`` is set.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from spark_outbox.cli.database import cli_actor, engine_for
from spark_outbox.core.durations import describe_s, parse_duration_s
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import retention


def register(sub: Any) -> None:
    p = sub.add_parser("purge", help="retention: delete finished effects and their attempts")
    p.add_argument(
        "--older-than", required=True, help="finished longer ago than this, e.g. 30d, 12h"
    )
    p.add_argument(
        "--forget-keys-older-than",
        help="the key ledger's horizon, at least --older-than (e.g. 400d): keys that "
        "finished before it are forgotten and could be sent again (default: kept for ever)",
    )
    p.add_argument("--dry-run", action="store_true", help="only count (default: purge)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        help="effects per transaction (default 1000, at most 10000)",
    )
    p.add_argument(
        "--pace",
        type=float,
        default=1.0,
        help="the share of the time the purge works, resting after each batch (default 1: "
        "as fast as it can; beside busy dispatchers e.g. 0.25, what their own purge uses)",
    )
    p.set_defaults(handler=purge)


def purge(args: argparse.Namespace, settings: Settings) -> int:
    older_than_s = parse_duration_s("--older-than", args.older_than)
    forget_s = 0.0
    if args.forget_keys_older_than:
        forget_s = parse_duration_s("--forget-keys-older-than", args.forget_keys_older_than)
        retention.check_horizon(older_than_s, forget_s)
    retention.check_pace(args.pace, "--pace")
    cutoff = retention.cutoff_for(older_than_s)
    horizon = retention.cutoff_for(forget_s) if forget_s else None
    engine = engine_for(settings)
    try:
        if args.dry_run:
            n = retention.count_purgeable(engine, cutoff)
            print(f"would purge {n} finished effect(s) older than {cutoff.isoformat()}")
            if horizon is not None:
                keys = retention.count_forgettable(engine, horizon)
                print(f"would forget up to {keys} key(s) finished before {horizon.isoformat()}")
            return 0

        def progress(done: retention.Purged) -> None:
            if done.batches % 50 == 0:
                print(f"  ... {done.effects} effects purged", file=sys.stderr, flush=True)

        began = time.monotonic()
        done = retention.purge(
            engine, cutoff, args.batch_size, horizon=horizon, on_batch=progress, pace=args.pace
        )
        wall_s = time.monotonic() - began
        retention.record_purge(engine, done, older_than_s, cli_actor())
    finally:
        engine.dispose()
    rate = done.effects / done.seconds if done.seconds else 0.0
    forgotten = f"; forgot {done.keys} key(s)" if horizon is not None else ""
    # (seconds working; with a pace, the rests too)
    paced = f", {wall_s:.1f} s with its rests at pace {args.pace:g}" if args.pace < 1 else ""
    print(
        f"purged {done.effects} effect(s) and {done.attempts} attempt(s) finished more than "
        f"{describe_s(older_than_s)} ago, in {done.batches} batch(es), {done.seconds:.1f} s "
        f"({rate:,.0f} effects/s){paced}{forgotten}"
    )
    return 0
