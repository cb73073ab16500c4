"""The private cluster: start, reuse, status, stop, and a crash-left pid file.

Uses its own state directory, so it never touches the cluster other tests share.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from outbox.tools.pgcluster import PrivateCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    # As root, pytest's tmp dir is closed to 'postgres': PrivateCluster relocates it.
    c = PrivateCluster(tmp_path_factory.mktemp("pg") / "state")
    yield c
    c.stop()
    subprocess.run(["rm", "-rf", str(c.state_dir)], check=False)


def _query(url: str) -> int:
    conn = psycopg2.connect(url)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")
            return int(cur.fetchone()[0])  # type: ignore[index]
    finally:
        conn.close()


def test_start_listens_on_loopback_with_a_password(cluster: PrivateCluster) -> None:
    info = cluster.ensure_running()
    assert _query(info.url) == 1
    assert "127.0.0.1" in info.url
    if os.geteuid() == 0:
        assert str(cluster.state_dir).startswith("/var/tmp/spark-outbox-")
    wrong = info.url.replace(info.password, "wrong-password")
    with pytest.raises(psycopg2.OperationalError, match="password"):
        _query(wrong)
    assert oct((cluster.state_dir / "cluster.json").stat().st_mode & 0o777) == "0o600"


def test_a_running_cluster_is_reused(cluster: PrivateCluster) -> None:
    first = cluster.ensure_running()
    pid_before = (cluster.data_dir / "postmaster.pid").read_text().splitlines()[0]
    second = PrivateCluster(cluster.state_dir).ensure_running()
    assert second.port == first.port
    assert (cluster.data_dir / "postmaster.pid").read_text().splitlines()[0] == pid_before


def test_status_and_stop(cluster: PrivateCluster) -> None:
    cluster.ensure_running()
    assert cluster.status()[0] is True
    assert cluster.stop() is True
    assert cluster.status()[0] is False
    assert cluster.stop() is False


def test_a_crash_left_pid_file_is_handled(cluster: PrivateCluster) -> None:
    info = cluster.ensure_running()
    pid = int((cluster.data_dir / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, 9)
    # The postmaster is gone but its pid file stays behind, as after a crash.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and cluster.status()[0]:
        time.sleep(0.1)
    assert (cluster.data_dir / "postmaster.pid").exists()
    restarted = cluster.ensure_running()
    assert _query(restarted.url) == 1
    assert restarted.password == info.password


def test_cli_db_commands(tmp_path: Path, cluster: PrivateCluster) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["OUTBOX_STATE_DIR"] = str(cluster.state_dir)

    def outbox(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "outbox", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert outbox("db", "start").returncode == 0
    status = outbox("db", "status")
    assert status.returncode == 0 and "running" in status.stdout
    url = outbox("db", "url").stdout.strip()
    assert _query(url) == 1
    assert outbox("db", "stop").returncode == 0
    stopped = outbox("db", "status")
    assert stopped.returncode == 3 and "stopped" in stopped.stdout
