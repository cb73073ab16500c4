"""The crash window at the dispatcher's defaults: re-sends and uncertain e-mails per
``kill -9`` (bench/crash.py says how the drill runs).

    flock /tmp/outbox-bench.lock .venv/bin/python -m bench crash
    ... -- [--kills 20] [--webhooks 30000] [--emails 3000] [--options "..."]
           [--code OTHER_CHECKOUT --repeat 3]

``bench dispatch`` runs the same drills after its tables (``--kills``, 0: skip).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import contenders, crash
from bench.bench_dispatch import uptime
from bench.database import bench_database, load
from bench.receiver import serve


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench crash")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--webhooks", type=int, default=30000, help="0: skip")
    parser.add_argument("--emails", type=int, default=3000, help="0: skip")
    parser.add_argument("--options", default="", help="dispatcher run options (default: none)")
    parser.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="DIR",
        help="also drill the dispatcher of this checkout, alternating with this one",
    )
    parser.add_argument("--repeat", type=int, default=1, help="drills per code, interleaved")
    args = parser.parse_args(argv)
    runs = [crash.Run(tuple(args.options.split()), Path(c)) for c in [contenders.ROOT, *args.code]]
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}", flush=True)
    with serve() as (base, receiver_pid), bench_database() as url:
        engine = load(url, base)
        ctx = contenders.Ctx(url=url, base=base, engine=engine, receiver_pid=receiver_pid)
        try:
            for r in range(args.repeat):
                for how in runs[r % len(runs) :] + runs[: r % len(runs)]:
                    crash.run(ctx, args.kills, args.webhooks, args.emails, how)
        finally:
            engine.dispose()
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}")
    return 0
