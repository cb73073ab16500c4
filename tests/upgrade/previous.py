"""The previous release, installed in an environment of its own for the upgrade drill.

``migrations/previous_release.toml`` names its commit. Its tree comes out of git
(``git archive``), pip builds it into a wheel and installs that, without
dependencies, into a virtual environment whose ``.pth`` file puts this
environment's site-packages after its own: the previous release's code on this
release's dependencies, as a rolling upgrade on one base image runs it (a
dependency that release needs and this one dropped fails here, loudly). Its
``outbox`` is the previous release's command; nothing of this checkout is on its
path (an editable install's ``.pth`` in the borrowed site-packages is not read).

Built once per commit, Python and dependency environment under ``.outbox/`` (a
file lock keeps two test runs from building at once); a clean machine builds it
in ~15 s (pip's cache serves the build backend), later runs reuse it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests import ROOT

RECORD = ROOT / "migrations" / "previous_release.toml"
CACHE = ROOT / ".outbox" / "previous-release"


@dataclasses.dataclass(frozen=True)
class Release:
    commit: str
    revision: str  # its outbox head
    billing_revision: str  # the example's head


def recorded() -> Release:
    data = tomllib.loads(RECORD.read_text())
    return Release(
        commit=str(data["commit"]),
        revision=str(data["revision"]),
        billing_revision=str(data["billing_revision"]),
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a process at this checkout, its
    database or its Python (Spark's workers then run the process's own Python)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DATABASE_URL")
        and not k.startswith(("PYSPARK_", "OUTBOX_"))
    }
    return env | extra


@dataclasses.dataclass(frozen=True)
class Installed:
    release: Release
    root: Path

    @property
    def python(self) -> Path:
        return self.root / "venv" / "bin" / "python"

    def outbox(self, *args: str) -> list[str]:
        """The previous release's ``outbox ARGS`` command line."""
        return [str(self.root / "venv" / "bin" / "outbox"), *args]


def install(release: Release, cache: Path = CACHE) -> Installed:
    """The release installed (or found installed) under ``cache``."""
    deps = sysconfig.get_paths()["purelib"]
    fingerprint = hashlib.sha256(f"{sys.version}\0{deps}".encode()).hexdigest()[:10]
    installed = Installed(release, cache / f"{release.commit[:12]}-{fingerprint}")
    stamp = installed.root / "installed"
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        if not stamp.is_file():
            shutil.rmtree(installed.root, ignore_errors=True)
            _build(release.commit, installed.root, deps)
            stamp.write_text(release.commit + "\n")
    return installed


def _build(commit: str, root: Path, deps: str) -> None:
    source, wheels, venv = root / "source", root / "wheel", root / "venv"
    source.mkdir(parents=True)
    archive = _run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], text=False)
    if archive.returncode != 0:  # a shallow clone (CI's may be): fetch the history once
        shallow = _run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"])
        if shallow.stdout.strip() == "true":
            _run(["git", "-C", str(ROOT), "fetch", "--quiet", "--unshallow"])
        else:
            _run(["git", "-C", str(ROOT), "fetch", "--quiet", "origin", commit])
        archive = _run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], text=False)
    if archive.returncode != 0:
        raise AssertionError(
            f"the previous release's commit {commit} (migrations/previous_release.toml) is "
            f"not in this clone ({archive.stderr.decode().strip()}): fetch it, e.g. "
            "`git fetch --unshallow` in a shallow CI checkout"
        )
    _check(_run(["tar", "-x", "-C", str(source)], input=archive.stdout, text=False))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _check(_run([*pip, "wheel", "--no-deps", "--quiet", "-w", str(wheels), str(source)]))
    _check(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)]))
    python = venv / "bin" / "python"
    own = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    Path(_check(own).stdout.strip(), "_dependencies.pth").write_text(deps + "\n")
    (wheel,) = wheels.glob("spark_outbox-*.whl")
    _check(_run([*pip, "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)]))
    shutil.rmtree(source)
    shutil.rmtree(wheels)
    where = _run([str(python), "-c", "import spark_outbox; print(spark_outbox.__file__)"])
    assert _check(where).stdout.startswith(str(venv)), f"not the installed release: {where}"


def _run(argv: list[str], *, text: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(
        argv, capture_output=True, text=text, env=clean_env(), cwd="/", timeout=900, **kwargs
    )


def _check(done: subprocess.CompletedProcess[Any]) -> subprocess.CompletedProcess[Any]:
    if done.returncode != 0:
        err = done.stderr if isinstance(done.stderr, str) else done.stderr.decode()
        raise AssertionError(f"{' '.join(map(str, done.args))[:300]}: {err[-3000:]}")
    return done


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
