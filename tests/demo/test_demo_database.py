"""`outbox demo` refuses a database it would mix its numbers with (no Spark needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import ROOT


def test_a_database_that_already_holds_effects_is_refused(db_url: str, tmp_path: Path) -> None:
    from spark_outbox.core import db
    from spark_outbox.core.enqueue import enqueue
    from spark_outbox.core.keys import effect_key
    from tests.conftest import insert_endpoint

    engine = db.create_engine(db_url, pool_size=1)
    try:
        insert_endpoint(engine, "someone-elses")
        with engine.begin() as conn:
            enqueue(
                conn, idempotency_key=effect_key("x", 1), endpoint="someone-elses", payload={"a": 1}
            )
    finally:
        engine.dispose()
    result = subprocess.run(
        [sys.executable, "-m", "spark_outbox", "demo", "--no-serve"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": db_url, "OUTBOX_STATE_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "already holds effects" in result.stderr
    assert "Point DATABASE_URL at a fresh database" in result.stderr


def test_the_demo_database_shows_no_password_but_its_url_still_carries_it(db_url: str) -> None:
    from sqlalchemy.engine import make_url

    from spark_outbox.cli.demo.database import prepare
    from spark_outbox.core.settings import Settings

    password = make_url(db_url).password
    assert password
    prepared = prepare(Settings(database_url=db_url))
    assert prepared.url == db_url and f":{password}@" in prepared.server_url
    for shown in (repr(prepared), str(prepared)):
        assert password not in shown and "fresh=False" in shown
