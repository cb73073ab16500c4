"""``outbox dispatcher run``: drain committed effects to their endpoints.

Signals are installed here (the entry point) and only ask the worker to stop:
SIGTERM/SIGINT -> stop claiming, finish in-flight sends up to
OUTBOX_SHUTDOWN_TIMEOUT_S, hand back unsent leases, exit 0. With
``--processes N`` (N > 1) this process is the supervisor of N such workers
(cli/supervisor.py).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import signal
from typing import Any

from spark_outbox.cli import supervisor
from spark_outbox.cli.database import database_url
from spark_outbox.cli.filter_args import port
from spark_outbox.core import db, revisions, tracing
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store
from spark_outbox.dispatch.worker import Worker

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("dispatcher", help="deliver committed effects (webhooks, e-mail)")
    cmds = p.add_subparsers(dest="dispatcher_command", required=True, metavar="ACTION")
    run = cmds.add_parser("run", help="run one worker until SIGTERM/SIGINT (or idle)")
    run.add_argument(
        "--concurrency", type=int, help="sends in flight (default: $OUTBOX_CONCURRENCY, else 128)"
    )
    run.add_argument(
        "--claim-batch-size",
        type=int,
        help="effects per claim (default: $OUTBOX_CLAIM_BATCH_SIZE, else 500)",
    )
    run.add_argument(
        "--nondedup-concurrency",
        type=int,
        help="sends in flight at once per endpoint that cannot deduplicate, the most a "
        "crash of this worker can leave uncertain (default: $OUTBOX_NONDEDUP_CONCURRENCY, "
        "else 4)",
    )
    run.add_argument(
        "--worker-id",
        help="name in heartbeats and the attempt log (default: $OUTBOX_WORKER_ID, else "
        "host-pid-random)",
    )
    run.add_argument(
        "--until-idle", action="store_true", help="exit 0 once nothing is due or in flight"
    )
    run.add_argument(
        "--metrics-port",
        type=port,
        help="serve Prometheus /metrics on this port (default: none, no metrics server)",
    )
    run.add_argument(
        "--metrics-host",
        help="address for --metrics-port; 0.0.0.0 in a container (default: "
        "$OUTBOX_METRICS_HOST, else 127.0.0.1)",
    )
    run.add_argument("--json", action="store_true", help="print a JSON summary on exit")
    run.add_argument(
        "--processes",
        type=int,
        help="worker processes under one supervisor (default: $OUTBOX_PROCESSES, else one per "
        f"core: {supervisor.host_cores()} here); worker ids and metrics ports get +i",
    )
    run.add_argument("--supervised-by", type=int, help=argparse.SUPPRESS)
    run.set_defaults(handler=run_dispatcher)


def run_dispatcher(args: argparse.Namespace, settings: Settings) -> int:
    if not args.supervised_by:  # a supervisor checked before starting its workers
        _require_schema(database_url(settings))
    processes = args.processes if args.processes is not None else settings.processes
    processes = processes if processes > 0 else supervisor.host_cores()
    if processes == 1:
        if args.supervised_by:
            supervisor.die_with(args.supervised_by)
        return run_worker(args, settings)
    env = os.environ | {
        "DATABASE_URL": database_url(settings),
        "OUTBOX_STATE_DIR": str(settings.state_dir),
        "OUTBOX_LOG_FORMAT": settings.log_format,
        "OUTBOX_LOG_LEVEL": settings.log_level,
    }
    commands, envs = [], []
    for i in range(processes):
        argv = _child_flags(args, i)
        commands.append(supervisor.child_command(argv))
        worker_id = args.worker_id or settings.worker_id
        envs.append(env | ({"OUTBOX_WORKER_ID": f"{worker_id}-{i}"} if worker_id else {}))
    return supervisor.supervise(commands, envs)


def _child_flags(args: argparse.Namespace, i: int) -> list[str]:
    """The flags of child ``i``: the same as ours, ports shifted (ids go by environment)."""
    flags: list[str] = []
    for name in ("concurrency", "claim_batch_size", "nondedup_concurrency"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    if args.metrics_port:
        flags += ["--metrics-port", str(args.metrics_port + i)]
    flags += ["--until-idle"] * args.until_idle + ["--json"] * args.json
    return flags


def _with_flags(args: argparse.Namespace, settings: Settings) -> Settings:
    overrides: dict[str, Any] = {}
    if args.concurrency is not None:
        overrides["concurrency"] = max(1, args.concurrency)
    if args.claim_batch_size is not None:
        overrides["claim_batch_size"] = max(1, args.claim_batch_size)
    if args.nondedup_concurrency is not None:
        overrides["nondedup_concurrency"] = max(1, args.nondedup_concurrency)
    if args.worker_id:
        overrides["worker_id"] = args.worker_id
    if args.metrics_host:
        overrides["metrics_host"] = args.metrics_host
    return dataclasses.replace(settings, **overrides)


def _serve_metrics(worker: Worker, host: str, port: int) -> None:
    """A taken port (a second dispatcher on one host) is a one-line error, not a traceback."""
    try:
        worker.metrics.serve(port, host)
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror or exc}); "
            "pick a free port (each dispatcher on a host needs its own) or check --metrics-host"
        ) from None


def _require_schema(url: str) -> None:
    """Before anything is claimed or registered: an older schema is refused in one line."""
    engine = db.create_engine(url, pool_size=1, application_name="outbox-dispatcher")
    try:
        revisions.require_usable(engine, "the dispatcher", unreachable_ok=True)
    finally:
        engine.dispose()


def _check_role_settings(engine: Any) -> None:
    """Without connection options the role must carry the dispatcher's settings: say
    which it lacks, and the statement that gives them (the claim stays correct without
    them, only slower after a big commit, and its records stay durable)."""
    with db.translated():
        missing = store.role_settings_missing(engine)
    if missing:
        fix = " ".join(
            f"ALTER ROLE <dispatcher role> SET {k} = {store.SESSION_SETTINGS[k]};" for k in missing
        )
        log.warning(
            "OUTBOX_STARTUP_OPTIONS=0 and the role lacks the dispatcher's settings "
            f"({', '.join(f'{k}={v}' for k, v in missing.items())}): {fix}",
            extra={"event": "dispatcher.role_settings", "missing": sorted(missing)},
        )


def _log_ssrf_allow_list(settings: Settings) -> None:
    """Said at start, so "why is my local receiver refused?" is answered in the log."""
    allowed = ",".join(str(n) for n in settings.ssrf_allow_networks)
    if allowed:
        message = f"webhooks may reach public addresses and {allowed}"
    else:
        message = (
            "webhooks may reach public addresses only; set OUTBOX_SSRF_ALLOW_NETWORKS "
            "(e.g. 127.0.0.1/32) to deliver to a local or private receiver"
        )
    log.info(
        message,
        extra={"event": "dispatcher.ssrf_allow_networks", "ssrf_allow_networks": allowed},
    )


def run_worker(args: argparse.Namespace, settings: Settings) -> int:
    settings = _with_flags(args, settings)
    url = database_url(settings)
    engine = db.create_engine(
        url, pool_size=4, application_name="outbox-dispatcher", **store.engine_options(settings)
    )
    if not settings.startup_options:
        _check_role_settings(engine)
    tracing.serve_as("outbox-dispatcher")  # OTEL_SERVICE_NAME, if set, wins
    worker = Worker(settings, engine, database_url=url, until_idle=args.until_idle)
    if args.metrics_port:
        _serve_metrics(worker, settings.metrics_host, args.metrics_port)
    _log_ssrf_allow_list(settings)

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
