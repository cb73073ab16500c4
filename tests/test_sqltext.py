"""Named statements are loaded without their comments: a ``:name`` in a comment was
bound like any other by SQLAlchemy's ``text()`` and put in place by psycopg2, and a
value with a newline then ended the comment and ran as SQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.console import audit
from spark_outbox.core import sqltext
from spark_outbox.core.sqltext import without_comments

ROOT = Path(__file__).resolve().parents[1]


def test_comments_go_and_quoted_text_stays() -> None:
    sql = (
        "SELECT 'it''s -- kept', \"a--b\", $$ -- kept $$, $t$ /* kept */ $t$, $1 -- gone :x\n"
        "FROM t /* gone /* nested */ still gone */ WHERE a = :a -- gone"
    )
    assert without_comments(sql) == (
        "SELECT 'it''s -- kept', \"a--b\", $$ -- kept $$, $t$ /* kept */ $t$, $1 \n"
        "FROM t   WHERE a = :a "
    )


def _statement_files() -> list[Path]:
    found = [
        p for d in ("api", "cli", "dispatcher", "spark_jobs") for p in (ROOT / d).rglob("*.sql")
    ]
    return sorted(p for p in found if "-- name:" in p.read_text())


@pytest.mark.parametrize("path", _statement_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_loaded_statement_keeps_a_comment(path: Path) -> None:
    # A statement with a comment left in it would lose it to the scanner again.
    for name, sql in sqltext.load(path).items():
        assert without_comments(sql) == sql, name


def test_a_value_with_a_newline_is_only_a_value(engine: Engine) -> None:
    """The audit trail's actor filter (its statement's comment named ``:actor``): a
    value that would end a comment and add a condition finds nothing and runs."""
    injected = "\nOR true --"
    with engine.connect() as conn:
        assert audit.operator_actions(conn, actor=injected, limit=5) == []
