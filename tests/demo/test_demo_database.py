"""`outbox demo` refuses a database it would mix its numbers with (no Spark needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository


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
