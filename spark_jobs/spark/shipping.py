"""This package, shipped to a cluster's executors whose Python does not have it.

Executors import the sink's executor modules (``executor``, ``chunks``, ``checks``,
``pgbinary``, ``preview_tasks``) and the ground floor's helpers they use. Spark
ships pure Python the same way on every cluster manager (standalone, YARN,
Kubernetes): a zip on the executors' ``sys.path``, given by ``spark-submit
--py-files`` or ``SparkContext.addPyFile``. So:

1. ``build`` writes the zip of the package this process imported (the
   executors run the driver's own code) and ``executor-requirements.txt``;
2. ``ship`` adds that zip to a running session (``outbox spark run`` does
   it for every master that is not local).

Imported from the zip, the ``.sql`` files beside the modules are read through
it (``spark_outbox.core.sqltext``). The compiled dependencies (psycopg2,
pyarrow, orjson; pandas for Spark's Arrow path) cannot be imported from a zip:
the workers' Python installs them from the requirements file.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import spark_outbox

log = logging.getLogger(__name__)

DISTRIBUTION = "spark-outbox"
# What the executors import beyond the standard library and PySpark's own worker.
EXECUTOR_DEPENDENCIES = ("psycopg2-binary", "orjson", "pyarrow", "pandas")
REQUIREMENTS_FILE = "executor-requirements.txt"
_SHIPPED_SUFFIXES = (".py", ".sql")
_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the same package gives the same bytes
_NAME = re.compile(r"^[A-Za-z0-9._-]+")


@dataclasses.dataclass(frozen=True)
class Package:
    zip_path: Path
    requirements_path: Path
    requirements: tuple[str, ...]


def zip_name() -> str:
    return f"spark_outbox-{_version()}.zip"


def build(out_dir: Path) -> Package:
    """Write the package's zip and the executors' requirements into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    zip_path = out_dir / zip_name()
    root = Path(spark_outbox.__file__).parent
    with zipfile.ZipFile(zip_path, "w", zipfile.ZIP_DEFLATED) as archive:
        for file in _package_files(root):
            member = zipfile.ZipInfo(f"spark_outbox/{file.relative_to(root).as_posix()}")
            member.date_time = _ZIP_EPOCH
            member.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(member, file.read_bytes())
    requirements = executor_requirements()
    requirements_path = out_dir / REQUIREMENTS_FILE
    requirements_path.write_text("".join(f"{r}\n" for r in requirements))
    return Package(zip_path, requirements_path, requirements)


def _package_files(root: Path) -> list[Path]:
    """Every module and SQL file; in the repository, through the links of ``spark_outbox/``."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        found += [Path(folder, f) for f in sorted(files) if f.endswith(_SHIPPED_SUFFIXES)]
    return found


def executor_requirements() -> tuple[str, ...]:
    """The executors' third-party dependencies with this distribution's version bounds
    (its installed metadata); bare names where it is not installed as a distribution."""
    try:
        declared = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        declared = []
    bounds = {}
    for requirement in declared:
        spec = requirement.split(";", 1)[0].strip()
        name = _NAME.match(spec)
        if name:
            bounds[name.group(0).lower()] = spec
    return tuple(bounds.get(name, name) for name in EXECUTOR_DEPENDENCIES)


def ship(spark: Any, work_dir: Path) -> Path | None:
    """Put this package on every executor's Python path for ``spark``'s application.

    Not on a local master (its Python workers run this interpreter, which has the
    package) nor when ``spark-submit --py-files`` already ships a zip of it: Spark
    refuses a second file of one name. ``work_dir`` must outlive the session: executors
    started later (a lost one replaced) fetch the zip from the driver then.
    """
    context = spark.sparkContext
    master = str(context.master)
    if master == "local" or master.startswith("local["):
        return None
    given = context.getConf().get("spark.submit.pyFiles", "") or ""
    if any(Path(p).name.startswith("spark_outbox-") for p in given.split(",") if p):
        return None
    zip_path = build(work_dir).zip_path
    context.addPyFile(str(zip_path))
    log.info(
        "package shipped to the executors",
        extra={"event": "spark.package_shipped", "path": str(zip_path), "master": master},
    )
    return zip_path


def _version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"
