"""The package as shipped to executors (``outbox spark package``): a zip that a Python
without this package imports the executor modules from, their SQL included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_outbox.spark import shipping

EXECUTOR_MODULES = (
    "executor",
    "chunks",
    "checks",
    "pgbinary",
    "preview_tasks",
    "source_tasks",
    "source_layout",
)
# Run with only the zip ahead of site-packages (the editable install's path to this
# repository comes after it): each module reports where it came from and its SQL.
PROBE = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    module = importlib.import_module("spark_outbox.spark." + name)
    found[name] = [module.__file__, sorted(getattr(module, "_Q", {}))]
print(json.dumps(found))
"""


def test_executor_modules_import_from_the_shipped_zip_with_their_sql(tmp_path: Path) -> None:
    made = shipping.build(tmp_path / "out")
    env = {**os.environ, "PYTHONPATH": str(made.zip_path)}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *EXECUTOR_MODULES],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    for name, (file, queries) in found.items():
        assert file == f"{made.zip_path}/spark_outbox/spark/{name}.py"
        if name in ("executor", "chunks", "preview_tasks", "source_tasks"):  # with a .sql file
            assert queries, name
    assert "copy_effects" in found["executor"][1]


def test_package_command_writes_the_zip_and_the_executors_requirements(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "spark_outbox", "spark", "package", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    zip_path = tmp_path / shipping.zip_name()
    assert f"--py-files {zip_path}\n" in done.stdout
    requirements = (tmp_path / shipping.REQUIREMENTS_FILE).read_text().split()
    names = [r.split("<")[0].split(">")[0] for r in requirements]
    assert names == ["psycopg2-binary", "orjson", "pyarrow", "pandas"]
    assert all(r != name for r, name in zip(requirements, names, strict=True))  # bounded


@pytest.mark.spark
def test_a_local_master_ships_nothing_its_workers_run_the_drivers_python(
    spark: Any, tmp_path: Path
) -> None:
    assert shipping.ship(spark, tmp_path) is None
    assert list(tmp_path.iterdir()) == []
