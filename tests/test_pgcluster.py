"""The private cluster: start, reuse, status, stop, and a crash-left pid file.

Uses its own state directory, so it never touches the cluster other tests share.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg2
import pytest

from spark_outbox.cli.main import build_parser, settings_from_args
from spark_outbox.cli.tools.pgcluster import SERVER_USER, PrivateCluster
from spark_outbox.core.errors import DatabaseUnavailable
from spark_outbox.core.settings import Settings, default_state_dir


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
            [sys.executable, "-m", "spark_outbox", *args],
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


def test_state_files_are_for_the_owner_only(cluster: PrivateCluster) -> None:
    """The log, the password in cluster.json and the data: 0600 files, 0700 directories
    (as root the state directory is 0710 with the server user's group, so that user can
    reach its data directory and list nothing)."""
    cluster.ensure_running()
    st = cluster.state_dir.stat()
    if os.geteuid() == 0:
        assert stat.S_IMODE(st.st_mode) == 0o710
        assert st.st_gid == pwd.getpwnam(SERVER_USER).pw_gid
    else:
        assert stat.S_IMODE(st.st_mode) == 0o700
    open_to_others = [
        f"{path} {stat.S_IMODE(path.lstat().st_mode):o}"
        for path in cluster.state_dir.rglob("*")
        if path.lstat().st_mode & 0o077
    ]
    assert open_to_others == []
    assert {"cluster.json", "cluster.lock", "postgres.log"} <= {
        p.name for p in cluster.state_dir.iterdir()
    }


def _outbox_db(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "spark_outbox", "--state-dir", str(state_dir), "db", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_status_and_stop_refuse_a_state_dir_someone_else_could_have_written(
    tmp_path: Path,
) -> None:
    """cluster.json names the binaries status and stop run: a directory another user
    owns or may write is refused before anything in it is read."""
    requested = tmp_path / "state"
    cluster = PrivateCluster(requested)
    state = cluster.state_dir
    (state / "pgdata").mkdir(parents=True)
    (state / "pgdata" / "PG_VERSION").write_text("16\n")
    planted = {"port": 1, "password": "x", "bin_dir": str(tmp_path / "planted")}
    (state / "cluster.json").write_text(json.dumps(planted))
    wrong = [("writable by group or others", lambda: state.chmod(0o777))]
    if os.geteuid() == 0:
        nobody = pwd.getpwnam("nobody")

        def other_owner() -> None:
            state.chmod(0o700)
            os.chown(state, nobody.pw_uid, nobody.pw_gid)

        wrong.append((f"owned by uid {nobody.pw_uid}", other_owner))
    try:
        for problem, make_it_so in wrong:
            make_it_so()
            for action in (cluster.status, cluster.stop):
                with pytest.raises(DatabaseUnavailable, match=problem):
                    action()
            for command in ("status", "stop"):
                refused = _outbox_db(requested, command)
                assert refused.returncode == 2, refused.stdout
                assert f"refusing to trust {state}" in refused.stderr
                assert problem in refused.stderr and "OUTBOX_STATE_DIR" in refused.stderr
    finally:
        shutil.rmtree(state)


def test_the_default_state_dir_is_one_per_user_whatever_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = {"HOME": "/home/ada"}
    assert default_state_dir(home) == Path("/home/ada/.local/state/spark-outbox")
    xdg = home | {"XDG_STATE_HOME": "/srv/state"}
    assert default_state_dir(xdg) == Path("/srv/state/spark-outbox")
    # The XDG spec ignores a relative path; so do we.
    relative = home | {"XDG_STATE_HOME": "state"}
    assert default_state_dir(relative) == Path("/home/ada/.local/state/spark-outbox")
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env(env=xdg).state_dir == Path("/srv/state/spark-outbox")
    assert Settings.from_env(env=xdg | {"OUTBOX_STATE_DIR": "/x"}).state_dir == Path("/x")
    assert settings_from_args(build_parser().parse_args(["--state-dir", "/y", "db", "status"])) \
        .state_dir == Path("/y")  # fmt: skip


def test_a_cluster_started_from_one_directory_is_found_from_any_other(tmp_path: Path) -> None:
    """`export DATABASE_URL="${DATABASE_URL:-$(outbox db url)}"` in one directory, then
    `outbox db status` and `outbox db url` in another: the same cluster, said where."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "OUTBOX_STATE_DIR")}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")  # the default, without the developer's home
    cluster = PrivateCluster(default_state_dir(env))  # as root: relocated for postgres
    state, where = cluster.state_dir, cluster.where
    here, there = tmp_path / "a", tmp_path / "b"
    here.mkdir()
    there.mkdir()

    def outbox(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "spark_outbox", *args],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip

    try:
        started = outbox(here, "db", "url")
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip()
        assert started.stdout == url + "\n" and url.startswith("postgresql://")
        (said,) = [
            line
            for line in started.stderr.splitlines()
            if line.startswith("outbox: private PostgreSQL")
        ]
        assert f"state in {where} " in said
        status = outbox(there, "db", "status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.startswith("running: ") and str(state) in status.stdout
        again = outbox(there, "db", "url")
        assert again.stdout.strip() == url and f"state in {where} " in again.stderr
        assert _query(url) == 1
        assert not (here / ".outbox").exists() and not (there / ".outbox").exists()
    finally:
        stopped = outbox(there, "db", "stop")
        shutil.rmtree(state, ignore_errors=True)
    assert stopped.stdout == f"stopped: {where}\n"


def test_status_points_at_a_cluster_left_under_the_former_default(tmp_path: Path) -> None:
    """Before, the default was .outbox under the current directory: status finds no
    cluster in the per-user place and says that one is there, and how to stop it."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "OUTBOX_STATE_DIR")}
    env["XDG_STATE_HOME"] = str(tmp_path / "xdg")
    former = PrivateCluster(tmp_path / ".outbox").state_dir  # as root: where it was moved
    former.mkdir(parents=True)
    (former / "cluster.json").write_text("{}")
    try:
        status = subprocess.run(
            [sys.executable, "-m", "spark_outbox", "db", "status"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        shutil.rmtree(former)
    assert status.returncode == 3
    assert status.stdout.startswith("no private cluster under ")
    assert str(tmp_path / "xdg" / "spark-outbox") in status.stdout  # (as root: "for ...")
    assert f"a private cluster is also under {former}" in status.stderr
    assert "outbox --state-dir .outbox db stop" in status.stderr


def test_the_cluster_info_shows_no_password_but_its_url_still_carries_it(
    cluster: PrivateCluster,
) -> None:
    info = cluster.ensure_running()
    assert info.password and f":{info.password}@" in info.url
    for shown in (repr(info), str(info)):
        assert info.password not in shown
        assert f"port={info.port}" in shown
    assert _query(info.url) == 1


def test_the_application_role_is_no_superuser_and_owns_its_database(
    cluster: PrivateCluster,
) -> None:
    """The URL every command gets names a role with only what the outbox needs: it
    logs in, creates databases (the demo's, the tests' and benches' scratch ones),
    owns the ``outbox`` database and so its ``public`` schema; it is no superuser and
    creates no roles. The bootstrap superuser only sets the cluster up."""
    info = cluster.ensure_running()
    conn = psycopg2.connect(info.url)
    try:
        with conn.cursor() as cur:
            cur.execute(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolreplication, rolbypassrls"
                " FROM pg_roles WHERE rolname = current_user"
            )
            assert cur.fetchone() == (False, False, True, False, False)
            cur.execute(
                "SELECT pg_get_userbyid(datdba) = current_user FROM pg_database"
                " WHERE datname = current_database()"
            )
            assert cur.fetchone() == (True,)
            cur.execute("SELECT has_schema_privilege('public', 'CREATE')")
            assert cur.fetchone() == (True,)
    finally:
        conn.close()
    assert info.admin_password and info.admin_password not in info.url
    for shown in (repr(info), str(info)):
        assert info.admin_password not in shown
