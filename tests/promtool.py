"""Prometheus's ``promtool``, for checking and unit-testing the alert rules.

Debian's ``prometheus`` package holds it; installing the package would also start a
Prometheus server, so it is downloaded (``apt-get download``, no root needed) and
unpacked once into the tests' state directory: nothing is installed system-wide and
no daemon starts. A ``promtool`` on PATH is used as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import TEST_STATE_DIR

TOOLS = TEST_STATE_DIR / "tools" / "prometheus"


def binary() -> Path | None:
    """promtool, fetched on first use; None where Debian's tools are missing."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    exe = TOOLS / "root" / "usr" / "bin" / "promtool"
    if exe.exists():
        return exe
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    download = TOOLS / "download"
    download.mkdir(parents=True, exist_ok=True)
    if _download(download).returncode != 0 and os.geteuid() == 0:
        # A clean machine may not have the package lists yet.
        subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=600)
        _download(download).check_returncode()
    for deb in download.glob("prometheus_*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(TOOLS / "root")], check=True)
    return exe


def _download(into: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["apt-get", "download", "prometheus"],
        cwd=into,
        capture_output=True,
        timeout=600,
        check=False,
    )


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = binary()
    if exe is None:
        raise RuntimeError("promtool needs apt-get and dpkg-deb (Debian) to be fetched")
    return subprocess.run(
        [str(exe), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
