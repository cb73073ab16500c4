"""``outbox dispatcher run``: drain committed effects to their endpoints.

Signals are installed here (the entry point) and only ask the worker to stop:
SIGTERM/SIGINT -> stop claiming, finish in-flight sends up to
OUTBOX_SHUTDOWN_TIMEOUT_S, hand back unsent leases, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
from typing import Any

from dispatcher import db
from dispatcher.settings import Settings
from dispatcher.worker import Worker
from outbox.database import database_url


def register(sub: Any) -> None:
    p = sub.add_parser("dispatcher", help="deliver committed effects (webhooks, e-mail)")
    cmds = p.add_subparsers(dest="dispatcher_command", required=True, metavar="ACTION")
    run = cmds.add_parser("run", help="run one worker until SIGTERM/SIGINT (or idle)")
    run.add_argument("--concurrency", type=int, help="sends in flight (default 64)")
    run.add_argument("--claim-batch-size", type=int, help="effects per claim (default 100)")
    run.add_argument("--worker-id", help="name in heartbeats and the attempt log")
    run.add_argument(
        "--until-idle", action="store_true", help="exit 0 once nothing is due or in flight"
    )
    run.add_argument("--metrics-port", type=int, help="serve Prometheus /metrics on this port")
    run.add_argument("--json", action="store_true", help="print a JSON summary on exit")
    run.set_defaults(handler=run_worker)


def _with_flags(args: argparse.Namespace, settings: Settings) -> Settings:
    overrides: dict[str, Any] = {}
    if args.concurrency is not None:
        overrides["concurrency"] = max(1, args.concurrency)
    if args.claim_batch_size is not None:
        overrides["claim_batch_size"] = max(1, args.claim_batch_size)
    if args.worker_id:
        overrides["worker_id"] = args.worker_id
    return dataclasses.replace(settings, **overrides)


def run_worker(args: argparse.Namespace, settings: Settings) -> int:
    settings = _with_flags(args, settings)
    url = database_url(settings)
    # No pre-ping: every store call is retried by DbCalls on a lost connection.
    engine = db.create_engine(
        url, pool_size=4, application_name="outbox-dispatcher", pre_ping=False
    )
    worker = Worker(settings, engine, database_url=url, until_idle=args.until_idle)
    if args.metrics_port:
        worker.metrics.serve(args.metrics_port)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, worker.stop)
        return await worker.run()

    try:
        code = _run(main())
    finally:
        engine.dispose()
    if args.json:
        summary = {"worker_id": worker.worker_id, "delivered": worker.delivered}
        print(json.dumps(summary | {"failed": worker.failed, "exit_code": code}))
    return code


def _run(coro: Any) -> int:
    """uvloop when installed (faster sockets for the HTTP pool), asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return int(uvloop.run(coro))
