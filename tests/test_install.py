"""The built wheel, installed as a user would: into empty virtual environments, with
each set of extras, run from a directory outside the repository.

One top-level package (``spark_outbox``); a core install runs every command that
needs no extra and refuses the others in one line naming the extra; the api and
spark extras run their commands for real (a served API, a Spark batch).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, revisions
from tests import ROOT
from tests.conftest import insert_billing_endpoints

pytestmark = pytest.mark.slow

# Never copied: the private clusters' and the benches' data (.outbox, .outbox-bench: the
# 10M-effect history is 30 GB; a copy of it filled the disk under a run), Spark's.
NOT_SOURCES = (
    ".git",
    ".venv",
    ".outbox*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "spark-warehouse",
    "metastore_db",
)


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("timeout", 600)
    kwargs.setdefault("env", _clean_env())
    return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload,no-any-return]


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that points Python at the repository
    (PYSPARK_PYTHON too: Spark's workers then run the environment's own Python)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("PYSPARK_")
    }
    env.pop("DATABASE_URL", None)
    return {**env, **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # From a copy: a build writes build/ and *.egg-info beside the sources, and a stale
    # build/lib of an earlier build would end up in the wheel.
    source = out / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(*NOT_SOURCES))
    built = _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(source)]
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("spark_outbox-*.whl")
    return path


class Env:
    """A fresh virtual environment with the wheel (and the given extras) installed."""

    def __init__(self, root: Path, wheel: Path, extras: str = "", deps: bool = True) -> None:
        self.root = root
        made = _run([sys.executable, "-m", "venv", "--without-pip", str(root)])
        assert made.returncode == 0, made.stderr
        self.site = next((root / "lib").glob("python3*/site-packages"))
        self.before = set(os.listdir(self.site))
        spec = f"{wheel}[{extras}]" if extras else str(wheel)
        argv = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python")]
        argv += ["install", "--quiet", "--disable-pip-version-check", spec]
        if not deps:
            argv.append("--no-deps")
        installed = _run(argv)
        assert installed.returncode == 0, installed.stderr

    def added(self) -> set[str]:
        return set(os.listdir(self.site)) - self.before

    def outbox(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return _run(
            [str(self.root / "bin" / "outbox"), *args],
            cwd=self.root,  # not the repository: nothing of it is importable from here
            env=_clean_env(**env),
        )


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Env:
    return Env(tmp_path_factory.mktemp("core") / "venv", wheel)


@pytest.fixture
def empty_db_url(server_url: str) -> Iterator[str]:
    url = scratch.create_empty_database(server_url)
    yield url
    scratch.drop_database(server_url, scratch.database_name(url))


def test_the_wheel_installs_one_top_level_package(tmp_path: Path, wheel: Path) -> None:
    env = Env(tmp_path / "venv", wheel, deps=False)
    added = env.added()
    assert {name for name in added if not name.endswith(".dist-info")} == {"spark_outbox"}
    (info,) = (name for name in added if name.endswith(".dist-info"))
    assert (env.site / info / "top_level.txt").read_text().split() == ["spark_outbox"]


def test_a_core_install_runs_what_needs_no_extra_and_names_the_extra_for_the_rest(
    core: Env, empty_db_url: str
) -> None:
    assert core.outbox("--help").returncode == 0
    upgraded = core.outbox("db", "upgrade", DATABASE_URL=empty_db_url)
    assert upgraded.returncode == 0, upgraded.stderr
    current = core.outbox("db", "current", DATABASE_URL=empty_db_url)
    assert current.returncode == 0 and revisions.head() in current.stdout
    listed = core.outbox("endpoints", "list", DATABASE_URL=empty_db_url)
    assert listed.returncode == 0, listed.stderr
    for argv, extra in (
        (["api", "serve"], "api"),
        (["spark", "run", "billing", "--input", "x"], "spark"),
        (["receiver", "serve"], "demo"),
    ):
        refused = core.outbox(*argv, DATABASE_URL=empty_db_url)
        assert refused.returncode == 2
        (line,) = refused.stderr.strip().splitlines()  # one line, no traceback
        assert f"pip install 'spark-outbox[{extra}]'" in line, line
    # Nothing of a core install needs aiohttp (the development tools' server).
    assert not any(name.startswith("aiohttp") for name in core.added())


def test_a_core_install_packages_itself_for_a_clusters_executors(core: Env, tmp_path: Path) -> None:
    """``outbox spark package`` from an installed wheel (real folders, not the
    repository's links): the zip holds the executor modules and their SQL, and the
    requirements carry the installed distribution's version bounds."""
    packed = core.outbox("spark", "package", "--out", str(tmp_path))
    assert packed.returncode == 0, packed.stderr
    (made,) = tmp_path.glob("spark_outbox-*.zip")
    names = set(zipfile.ZipFile(made).namelist())
    assert {"spark_outbox/spark/executor.py", "spark_outbox/spark/executor.sql"} <= names
    assert "spark_outbox/core/sqltext.py" in names
    requirements = (tmp_path / "executor-requirements.txt").read_text().splitlines()
    assert requirements[0].startswith("psycopg2-binary") and "<3" in requirements[0]


def test_the_api_extra_serves_the_api(tmp_path: Path, wheel: Path, empty_db_url: str) -> None:
    env = Env(tmp_path / "venv", wheel, extras="api")
    assert env.outbox("db", "upgrade", DATABASE_URL=empty_db_url).returncode == 0
    port = scratch.free_port()
    proc = subprocess.Popen(
        [str(env.root / "bin" / "outbox"), "api", "serve", "--port", str(port)],
        cwd=env.root,
        env=_clean_env(DATABASE_URL=empty_db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
                time.sleep(0.2)
        assert answer.status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


@pytest.mark.spark
def test_the_spark_extra_runs_the_example_job(
    tmp_path: Path, wheel: Path, empty_db_url: str
) -> None:
    env = Env(tmp_path / "venv", wheel, extras="spark")
    assert env.outbox("db", "upgrade", DATABASE_URL=empty_db_url).returncode == 0
    engine = db.create_engine(empty_db_url, pool_size=1)
    try:
        insert_billing_endpoints(engine)
        events = tmp_path / "events"
        made = env.outbox(
            "spark", "generate", "--out", str(events), "--days", "1", "--events", "300",
            "--customers", "10",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        ran = env.outbox(
            "spark", "run", "billing", "--input", str(events), "--date", "2026-01-01",
            "--master", "local[1]", DATABASE_URL=empty_db_url,
        )  # fmt: skip
        assert ran.returncode == 0, ran.stderr
        with engine.connect() as conn:
            invoices = conn.execute(sa.text("SELECT count(*) FROM invoices")).scalar_one()
            effects = conn.execute(sa.text("SELECT count(*) FROM effects")).scalar_one()
        assert invoices > 0 and effects == 2 * invoices  # a webhook and an e-mail each
    finally:
        engine.dispose()
