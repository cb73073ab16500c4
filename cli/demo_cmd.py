"""``outbox demo``: the whole pipeline end to end on this machine (see cli/demo/)."""

from __future__ import annotations

import argparse
from typing import Any

from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the pipeline end to end on local Spark and PostgreSQL")
    p.add_argument("--no-serve", action="store_true", help="exit after the report")
    p.add_argument("--crash", action="store_true", help="kill -9 the Spark driver and a dispatcher")
    p.add_argument("--customers", type=_positive, default=1000, help="customers (default 1000)")
    p.add_argument("--events", type=_positive, default=100_000, help="usage events (100000)")
    p.add_argument("--seed", type=int, default=42, help="seed of the data and of the failures")
    p.add_argument(
        "--fail-rate", type=float, default=0.05, help="fraction the receivers fail (0.05)"
    )
    p.add_argument("--batch-days", type=_positive, default=2, help="days billed in batch (2)")
    p.add_argument(
        "--stream-days", type=_positive, default=3, help="days arriving at the stream (3)"
    )
    p.add_argument(
        "--report-json", help="also write the report as JSON to this file (default: none)"
    )
    p.add_argument(
        "--drain-timeout", type=float, default=600, help="seconds to wait for the dispatchers"
    )
    p.set_defaults(handler=run, extras=("spark", "api", "demo"))


def _positive(raw: str) -> int:
    value = int(raw)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{raw} is not a positive integer")
    return value


def run(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.cli.demo.run import run as run_demo

    return run_demo(args, settings)
