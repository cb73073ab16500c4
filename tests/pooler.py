"""A real PgBouncer in front of the test cluster, as production runs one.

The binary is Debian's package (``apt-get download`` needs no root), unpacked
once into the tests' state directory with the one library the machine lacks
(c-ares); nothing is installed system-wide. Run as the server's unprivileged
user when the tests run as root (PgBouncer refuses root, like PostgreSQL).
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from spark_outbox.cli.tools.pgcluster import SERVER_USER, resolve_state_dir
from spark_outbox.cli.tools.scratch import free_port
from tests.conftest import TEST_STATE_DIR

PACKAGES = ("pgbouncer", "libc-ares2")
TOOLS = TEST_STATE_DIR / "tools" / "pgbouncer"


def binary() -> tuple[Path, Path] | None:
    """(pgbouncer, its library directory), fetched on first use; None without apt-get."""
    exe = TOOLS / "root" / "usr" / "sbin" / "pgbouncer"
    libs = TOOLS / "root" / "usr" / "lib" / "x86_64-linux-gnu"
    if exe.exists():
        return exe, libs
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        return None
    download = TOOLS / "download"
    download.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["apt-get", "download", *PACKAGES],
        cwd=download,
        check=True,
        capture_output=True,
        timeout=300,
    )
    for deb in download.glob("*.deb"):
        subprocess.run(["dpkg-deb", "-x", str(deb), str(TOOLS / "root")], check=True)
    return exe, libs


class PgBouncer:
    """PgBouncer on a free loopback port, forwarding every database to ``upstream``."""

    def __init__(
        self, upstream_url: str, *, pool_mode: str = "transaction", pool_size: int = 10
    ) -> None:
        found = binary()
        if found is None:
            raise RuntimeError("PgBouncer needs apt-get and dpkg-deb (Debian) to be fetched")
        self.exe, self.libs = found
        self.upstream = make_url(upstream_url)
        self.port = free_port()
        # Under the state directory, which the server's user can reach (a pytest
        # tmp_path under /tmp/pytest-of-root is private to root).
        self.work_dir = resolve_state_dir(TEST_STATE_DIR) / "pgbouncer" / str(self.port)
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, database_url: str) -> str:
        """``database_url`` (a database of the upstream server) through the pooler."""
        return make_url(database_url).set(port=self.port).render_as_string(hide_password=False)

    def _write_config(self) -> Path:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        user, password = self.upstream.username, self.upstream.password
        (self.work_dir / "userlist.txt").write_text(f'"{user}" "{password}"\n')
        ini = self.work_dir / "pgbouncer.ini"
        ini.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={self.upstream.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {self.port}",
                    "unix_socket_dir =",
                    "auth_type = scram-sha-256",
                    f"auth_file = {self.work_dir / 'userlist.txt'}",
                    f"pool_mode = {self.pool_mode}",
                    "max_client_conn = 1000",
                    f"default_pool_size = {self.pool_size}",
                    f"logfile = {self.work_dir / 'pgbouncer.log'}",
                    "server_reset_query =",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            pw = pwd.getpwnam(SERVER_USER)
            os.chown(self.work_dir, pw.pw_uid, pw.pw_gid)
            for p in self.work_dir.iterdir():
                os.chown(p, pw.pw_uid, pw.pw_gid)
            os.chmod(self.work_dir / "userlist.txt", 0o600)
        return ini

    def start(self) -> PgBouncer:
        ini = self._write_config()
        cmd = [str(self.exe), str(ini)]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", SERVER_USER, "--", "env", f"LD_LIBRARY_PATH={self.libs}", *cmd]
        env = {**os.environ, "LD_LIBRARY_PATH": str(self.libs)}
        self.proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log()[-2000:]}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()[-2000:]}")

    def log(self) -> str:
        path = self.work_dir / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None
        shutil.rmtree(self.work_dir, ignore_errors=True)
