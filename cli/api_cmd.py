"""``outbox api serve``: the status and delivery-audit API under uvicorn."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from spark_outbox.cli.database import database_url
from spark_outbox.cli.filter_args import port
from spark_outbox.core import db, revisions
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="the status and delivery-audit API and the support page")
    cmds = p.add_subparsers(dest="api_command", required=True, metavar="ACTION")
    serve_p = cmds.add_parser("serve", help="serve the API (uvicorn); SIGTERM stops it cleanly")
    serve_p.add_argument("--host", help="bind address (default: $OUTBOX_API_HOST or 127.0.0.1)")
    serve_p.add_argument("--port", type=port, help="port (default: $OUTBOX_API_PORT or 8000)")
    serve_p.set_defaults(handler=serve, extras=("api",))


def serve(args: argparse.Namespace, settings: Settings) -> int:
    """Build the app here, at the entry point, and serve it until SIGTERM/SIGINT."""
    from spark_outbox.api.app import create_app
    from spark_outbox.api.server import serve_until_stopped

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["api_host"] = args.host
    if args.port is not None:
        overrides["api_port"] = args.port
    overrides["database_url"] = database_url(settings)
    settings = dataclasses.replace(settings, **overrides)
    _require_schema(settings.database_url)  # one line and exit 2, not uvicorn's traceback
    serve_until_stopped(create_app(settings), settings.api_host, settings.api_port)
    return 0


def _require_schema(url: str) -> None:
    engine = db.create_engine(url, pool_size=1, application_name="outbox-api")
    try:
        revisions.require_usable(engine, "the API", unreachable_ok=True)
    finally:
        engine.dispose()
