"""The drills' last word: ``outbox verify`` over the whole database finds nothing."""

from __future__ import annotations

from sqlalchemy.engine import Engine

from spark_outbox.console import verify


def assert_invariants(engine: Engine) -> None:
    """Every invariant of spark_outbox.console.verify holds, history read whole."""
    with engine.connect() as conn:
        report = verify.Checker(settle_s=0).run_until_current(conn)
    assert report.ok, "\n".join(verify.render(report.violations))
