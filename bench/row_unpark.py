"""The unpark trigger as it was before migration 2810 (one row at a time), for one
contender's rounds: ``bench dispatch -- --row-unpark`` runs the ordered contender
once on it and once on today's statement trigger, side by side in each round."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.contenders import ROOT
from spark_outbox.core import objects

_NAMES = ("effect_unpark_successor", "effects_unpark_on_finish", "effects_unpark_on_delete")


def _row_triggers() -> str:
    """The row trigger's text, from the migration that replaced it (its downgrade)."""
    (path,) = (ROOT / "migrations" / "versions").glob("*_unpark_once_a_statement.py")
    spec = importlib.util.spec_from_file_location("unpark_once_a_statement", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return str(module._ROW_TRIGGERS)


@contextmanager
def row_unpark(engine: Engine) -> Iterator[None]:
    """The row trigger installed for the block, today's put back after it."""
    with engine.begin() as conn:
        conn.execute(sa.text(_row_triggers()))
    try:
        yield
    finally:
        with engine.begin() as conn:
            for name in _NAMES:
                conn.execute(sa.text(objects.text(name)))
