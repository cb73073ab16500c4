"""The docs say what the code does: the README's integration example runs as written
(extracted from README.md itself), and the metric names the docs list are the ones
exported by the API and by a dispatcher."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from tests import ROOT

FENCE = re.compile(r"<!-- readme-example: (\w+)[^>]*-->\s*```\w*\n(.*?)```", re.DOTALL)


def readme_examples() -> dict[str, str]:
    return dict(FENCE.findall((ROOT / "README.md").read_text()))


def test_the_readme_has_the_three_marked_example_blocks() -> None:
    assert set(readme_examples()) == {"setup", "python", "output"}


def test_the_readme_integration_example_runs_as_written(db_url: str, engine: Engine) -> None:
    blocks = readme_examples()
    env = {
        **os.environ,
        "DATABASE_URL": db.libpq_url(db_url),  # what `outbox db url` prints
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "OUTBOX_LOG_FORMAT": "text",
    }
    env.pop("OUTBOX_SSRF_ALLOW_NETWORKS", None)
    setup = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", blocks["setup"]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert setup.returncode == 0, setup.stderr
    run = subprocess.run(
        [sys.executable, "-c", blocks["python"]],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == blocks["output"]
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT endpoint, recipient, state FROM effects ORDER BY endpoint")
        ).all()
    assert [tuple(r) for r in rows] == [
        ("orders-email", "ada@example.com", "pending"),
        ("orders-webhook", None, "pending"),
    ]
