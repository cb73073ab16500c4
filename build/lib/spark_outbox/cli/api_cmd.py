"""``outbox api serve``: the status and delivery-audit API under uvicorn."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
from collections.abc import Iterator
from types import FrameType
from typing import Any

import uvicorn

from spark_outbox.cli.database import database_url
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="the status and delivery-audit API and the support page")
    cmds = p.add_subparsers(dest="api_command", required=True, metavar="ACTION")
    serve_p = cmds.add_parser("serve", help="serve the API (uvicorn); SIGTERM stops it cleanly")
    serve_p.add_argument("--host", help="bind address (default: $OUTBOX_API_HOST or 127.0.0.1)")
    serve_p.add_argument("--port", type=int, help="port (default: $OUTBOX_API_PORT or 8000)")
    serve_p.set_defaults(handler=serve)


def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Build the app here, at the entry point, and serve it until SIGTERM/SIGINT."""
    from spark_outbox.api.app import create_app

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["api_host"] = args.host
    if args.port is not None:
        overrides["api_port"] = args.port
    overrides["database_url"] = database_url(settings)
    settings = dataclasses.replace(settings, **overrides)
    app = create_app(settings)
    # log_config=None keeps the JSON/text logging that cli.main configured.
    config = uvicorn.Config(
        app,
        host=settings.api_host,
        port=settings.api_port,
        log_config=None,
        access_log=False,
        server_header=False,
    )
    server = _CleanExitServer(config)
    server.run()
    return 0


class _CleanExitServer(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown (exit status -15);
    the CLI contract is exit 0 after a clean shutdown, so the signal only asks to stop."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        def stop(signum: int, frame: FrameType | None) -> None:
            if self.should_exit and signum == signal.SIGINT:
                self.force_exit = True  # a second Ctrl-C: stop waiting for requests
            self.should_exit = True

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
