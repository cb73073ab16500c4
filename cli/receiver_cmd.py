"""``outbox receiver serve`` and ``outbox mailcatcher serve``: the reference receivers.

Both print one JSON line on stdout once listening (``{"url": ..., ...}``), so a
caller that asked for port 0 learns the port, and both exit 0 on SIGTERM or
SIGINT after closing their servers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from spark_outbox.cli.filter_args import port
from spark_outbox.cli.tools.receipts import ReceiptLog, check_rate
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings

SECRET_ENV = "OUTBOX_RECEIVER_SECRET"  # noqa: S105  (the variable's name, not a secret)


def register(sub: Any) -> None:
    p = sub.add_parser("receiver", help="the reference webhook receiver (verifies, dedupes)")
    cmds = p.add_subparsers(dest="receiver_command", required=True, metavar="ACTION")
    serve = cmds.add_parser("serve", help="receive signed webhooks on loopback")
    _common(serve, default_port=8900)
    serve.add_argument(
        "--secret",
        help=f"the endpoint's signing secret, whsec_... (default: ${SECRET_ENV}, else generated)",
    )
    serve.set_defaults(handler=serve_receiver, extras=("demo",))

    m = sub.add_parser("mailcatcher", help="a local SMTP server that catches and counts mail")
    mcmds = m.add_subparsers(dest="mailcatcher_command", required=True, metavar="ACTION")
    mserve = mcmds.add_parser("serve", help="catch SMTP on loopback; stats over HTTP")
    _common(mserve, default_port=8025)
    mserve.add_argument("--http-port", type=port, default=0, help="stats port (0: a free one)")
    mserve.set_defaults(handler=serve_mailcatcher, extras=("demo",))


def _common(p: argparse.ArgumentParser, default_port: int) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port, default=default_port, help="0: pick a free port")
    p.add_argument("--fail-rate", type=float, default=0.0, help="fail this fraction, e.g. 0.05")
    p.add_argument("--seed", type=int, default=0, help="seed of the deterministic failures")
    p.add_argument(
        "--jsonl", type=Path, help="also append every accepted receipt to this file (default: none)"
    )


def _receipts(args: argparse.Namespace) -> ReceiptLog:
    return ReceiptLog(seed=args.seed, fail_rate=check_rate(args.fail_rate), jsonl_path=args.jsonl)


def serve_receiver(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.core.endpoints import SECRET_PREFIX, generate_signing_secret

    secret = args.secret or os.environ.get(SECRET_ENV, "")
    generated = not secret
    secret = secret or generate_signing_secret()
    if not secret.startswith(SECRET_PREFIX):
        raise ConfigurationError(
            f"--secret must start with {SECRET_PREFIX!r}; omit it to have one generated"
        )
    return asyncio.run(_run_receiver(args, secret, generated))


async def _run_receiver(args: argparse.Namespace, secret: str, generated: bool) -> int:
    from spark_outbox.cli.tools import receiver

    receipts = _receipts(args)
    runner, port = await receiver.start(receiver.create_app(secret, receipts), args.host, args.port)
    info: dict[str, Any] = {"url": f"http://{args.host}:{port}", "fail_rate": args.fail_rate}
    if generated:
        # Shown once, like `outbox endpoints add`: the user registers the endpoint with it.
        info["generated_secret"] = secret
    _announce(info)
    try:
        await _until_signalled()
    finally:
        await runner.cleanup()
    return 0


def serve_mailcatcher(args: argparse.Namespace, settings: Settings) -> int:
    return asyncio.run(_run_mailcatcher(args))


async def _run_mailcatcher(args: argparse.Namespace) -> int:
    import logging

    from spark_outbox.cli.tools import mailcatcher, receiver

    # aiosmtpd logs every SMTP command at INFO: far too chatty for a catcher.
    logging.getLogger("mail.log").setLevel(logging.WARNING)

    receipts = _receipts(args)
    smtp, smtp_port = await mailcatcher.start_smtp(receipts, args.host, args.port)
    runner, http_port = await receiver.start(
        mailcatcher.create_stats_app(receipts), args.host, args.http_port
    )
    _announce(
        {
            "smtp_host": args.host,
            "smtp_port": smtp_port,
            "url": f"http://{args.host}:{http_port}",
            "fail_rate": args.fail_rate,
        }
    )
    try:
        await _until_signalled()
    finally:
        smtp.close()
        await smtp.wait_closed()
        await runner.cleanup()
    return 0


def _announce(info: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
