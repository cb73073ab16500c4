"""``outbox demo``: the whole pipeline end to end on this machine."""

from __future__ import annotations

import argparse
from typing import Any

from dispatcher import db
from dispatcher.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="run the pipeline end to end on local Spark and PostgreSQL")
    p.add_argument("--no-serve", action="store_true", help="exit after the report")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace, settings: Settings) -> int:
    url = db.database_url(settings)
    db.upgrade(url)
    print(f"database ready at {db.redact(url)}, schema at head")
    return 0
