"""A private PostgreSQL cluster started from the machine's server binaries.

Used when ``DATABASE_URL`` is unset, so the demo and the tests need nothing
installed or started by hand. The cluster listens on 127.0.0.1 only, on a free
port, with password (SCRAM) authentication over TCP and no Unix socket; its
password lives in the state directory, readable by the owner only (files 0600,
the directory 0700; as root 0710 with the server user's group, so that user can
reach its data directory and nothing else). ``start``, ``status`` and ``stop``
refuse a state directory or ``cluster.json`` that is a link, belongs to another
user or is writable by others.

PostgreSQL refuses to run as root; as root, the server commands run as the
unprivileged ``postgres`` user through ``runuser``, and the data directory is
placed where that user can reach it.

Two roles, each with its own password in ``cluster.json``: ``postgres``, the
bootstrap superuser, only sets the cluster up (the application role and the
``outbox`` database, at each start); ``outbox``, the role in the URL every command
gets, is no superuser: it logs in, may create databases (the demo's and the tests'
scratch ones, which it then owns) and owns the ``outbox`` database, so the
migrations create their tables in its ``public`` schema (docs/operations.md,
"The database role"). A cluster made by a version before the split has only
``outbox``, a superuser: it keeps working, with a warning saying how to re-create it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

ADMIN_ROLE = "postgres"  # the bootstrap superuser: sets the cluster up, nothing else
APP_ROLE = "outbox"  # the URL's role: no superuser (see _create_database for its grants)
DATABASE = "outbox"
SERVER_USER = "postgres"
_STATE_FILE = "cluster.json"


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    data_dir: Path
    port: int
    # Out of repr (and so of str, logs and tracebacks); ``url`` still carries it.
    password: str = dataclasses.field(repr=False)
    bin_dir: Path
    # The bootstrap superuser's; None: a cluster made before the roles were split,
    # whose only role (APP_ROLE) is that superuser.
    admin_password: str | None = dataclasses.field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"postgresql://{APP_ROLE}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"


def find_bin_dir() -> Path:
    """Locate ``initdb``/``pg_ctl``: PATH, then ``pg_config``, then Debian's layout."""
    candidates: list[Path] = []
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(Path(on_path).resolve().parent)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True
            )
            candidates.append(Path(out.stdout.strip()))
    debian = Path("/usr/lib/postgresql")
    if debian.is_dir():
        versions = sorted(
            (p for p in debian.iterdir() if p.name.isdigit()),
            key=lambda p: int(p.name),
            reverse=True,
        )
        candidates.extend(v / "bin" for v in versions)
    for bin_dir in candidates:
        if (bin_dir / "initdb").is_file() and (bin_dir / "pg_ctl").is_file():
            return bin_dir
    raise DatabaseUnavailable(
        "PostgreSQL server binaries (initdb, pg_ctl) were not found on PATH, via pg_config, "
        "or under /usr/lib/postgresql/<version>/bin. Install them (Debian/Ubuntu: "
        "`apt-get install postgresql`; macOS: `brew install postgresql@15`) or set "
        "DATABASE_URL to an existing server."
    )


def _running_as_root() -> bool:
    return os.geteuid() == 0


def _as_server_user(cmd: list[str]) -> list[str]:
    if not _running_as_root():
        return cmd
    runuser = shutil.which("runuser")
    if runuser is None:
        raise DatabaseUnavailable(
            "running as root needs `runuser` to start PostgreSQL as 'postgres'"
        )
    return [runuser, "-u", SERVER_USER, "--", *cmd]


def resolve_state_dir(state_dir: Path) -> Path:
    """Where the cluster lives: ``state_dir`` unless root's server user cannot reach it.

    As root, ``state_dir`` is often under /root (mode 700), which ``postgres``
    cannot enter; then the cluster goes to /var/tmp under a name derived from
    the requested path, so the same project always finds the same cluster.
    """
    state_dir = state_dir.absolute()
    if not _running_as_root() or _server_user_can_reach(state_dir):
        return state_dir
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    # A predictable name in a shared directory: _locked() refuses it unless we own it.
    return Path("/var/tmp") / f"spark-outbox-{digest}"  # noqa: S108


def _server_user_can_reach(path: Path) -> bool:
    """True when every existing ancestor of ``path`` is traversable by the server user."""
    try:
        pw = pwd.getpwnam(SERVER_USER)
    except KeyError as exc:
        raise DatabaseUnavailable(
            f"running as root, PostgreSQL must run as an unprivileged user, and there is no "
            f"'{SERVER_USER}' user; create one (`useradd --system {SERVER_USER}`) or run as a "
            "normal user"
        ) from exc
    probe = path
    while not probe.exists():
        probe = probe.parent
    for parent in [probe, *probe.parents]:
        st = parent.stat()
        if st.st_uid == pw.pw_uid:
            mode_ok = bool(st.st_mode & 0o100)
        elif st.st_gid == pw.pw_gid:
            mode_ok = bool(st.st_mode & 0o010)
        else:
            mode_ok = bool(st.st_mode & 0o001)
        if not mode_ok:
            return False
    return True


def _check_trusted(path: Path) -> None:
    """Refuse a state directory or file that someone else could have written.

    ``cluster.json`` names the binaries that ``start``, ``status`` and ``stop`` run
    (as root too): whoever can write it can make us run anything.
    """
    st = path.lstat()
    problem = None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif st.st_uid != os.geteuid():
        problem = f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o022:
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    if problem is not None:
        raise DatabaseUnavailable(
            f"refusing to trust {path}: it {problem}; remove it or choose another state "
            "directory (--state-dir or OUTBOX_STATE_DIR)"
        )


def _make_private(state_dir: Path) -> None:
    """Owner only (0700); as root, the server user may traverse it to its data (0710)."""
    if _running_as_root():
        os.chown(state_dir, -1, pwd.getpwnam(SERVER_USER).pw_gid)
        state_dir.chmod(0o710)
    else:
        state_dir.chmod(0o700)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    """Serialise start/stop across processes (parallel test workers, a demo)."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_trusted(state_dir)
    _make_private(state_dir)
    fd = os.open(state_dir / "cluster.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    with os.fdopen(fd, "w") as lock:
        os.fchmod(fd, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


class PrivateCluster:
    """Start, reuse, inspect and stop the private cluster under ``state_dir``."""

    def __init__(self, state_dir: Path, server_settings: Mapping[str, str] | None = None) -> None:
        """``server_settings``: more ``-c name=value`` options at start (the history
        bench's cluster sizes its memory like a production server's)."""
        self.server_settings = dict(server_settings or {})
        self.requested_dir = state_dir.absolute()
        self.state_dir = resolve_state_dir(state_dir)
        self.data_dir = self.state_dir / "pgdata"
        self.log_file = self.state_dir / "postgres.log"

    @property
    def where(self) -> str:
        """The state directory, for a person: with the one asked for when root moved it."""
        if self.state_dir == self.requested_dir:
            return str(self.state_dir)
        return f"{self.state_dir} (for {self.requested_dir}, which {SERVER_USER!r} cannot reach)"

    # -- public -------------------------------------------------------------

    def ensure_running(self) -> ClusterInfo:
        """Return the running cluster, starting (and first creating) it if need be."""
        with _locked(self.state_dir):
            info = self._load()
            if info is None:
                info = self._initdb()
            if not self._is_running(info):
                info = self._start(info)
            return info

    def status(self) -> tuple[bool, ClusterInfo | None]:
        """Whether it runs, and what ``cluster.json`` says; refuses an untrusted directory."""
        if not os.path.lexists(self.state_dir):
            return False, None
        _check_trusted(self.state_dir)
        info = self._load()
        return (info is not None and self._is_running(info)), info

    def stop(self) -> bool:
        """Stop the cluster; False when it was not running."""
        if not os.path.lexists(self.state_dir):
            return False
        with _locked(self.state_dir):
            info = self._load()
            if info is None or not self._is_running(info):
                return False
            self._run(
                [str(info.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"]
            )
            return True

    # -- internals ----------------------------------------------------------

    def _load(self) -> ClusterInfo | None:
        path = self.state_dir / _STATE_FILE
        if not path.is_file() or not (self.data_dir / "PG_VERSION").is_file():
            return None
        _check_trusted(path)
        raw = json.loads(path.read_text())
        return ClusterInfo(
            data_dir=self.data_dir,
            port=int(raw["port"]),
            password=str(raw["password"]),
            bin_dir=Path(raw["bin_dir"]),
            admin_password=raw.get("admin_password"),
        )

    def _save(self, info: ClusterInfo) -> None:
        path = self.state_dir / _STATE_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)
            saved = {"port": info.port, "password": info.password, "bin_dir": str(info.bin_dir)}
            if info.admin_password is not None:
                saved["admin_password"] = info.admin_password
            json.dump(saved, f)

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(_as_server_user(cmd), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise DatabaseUnavailable(
                f"{Path(cmd[0]).name} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[-2000:]}"
                + (f"\nserver log: {self.log_file}" if self.log_file.exists() else "")
            )
        return result

    def _chown_to_server_user(self, *paths: Path) -> None:
        if _running_as_root():
            pw = pwd.getpwnam(SERVER_USER)
            for p in paths:
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def _initdb(self) -> ClusterInfo:
        bin_dir = find_bin_dir()
        if self.data_dir.exists():
            shutil.rmtree(self.data_dir)  # a half-made cluster from an interrupted initdb
        self.data_dir.mkdir(mode=0o700)
        self._chown_to_server_user(self.data_dir)
        admin_password = secrets.token_urlsafe(24)
        with tempfile.NamedTemporaryFile("w", dir=self.state_dir, delete=False) as pwfile:
            pwfile.write(admin_password + "\n")
        pwpath = Path(pwfile.name)
        try:
            pwpath.chmod(0o600)
            self._chown_to_server_user(pwpath)
            self._run(
                [
                    str(bin_dir / "initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    ADMIN_ROLE,
                    f"--pwfile={pwpath}",
                    "--auth-local=scram-sha-256",
                    "--auth-host=scram-sha-256",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--no-sync",
                ]
            )
        finally:
            pwpath.unlink(missing_ok=True)
        info = ClusterInfo(
            self.data_dir, free_port(), secrets.token_urlsafe(24), bin_dir, admin_password
        )
        self._save(info)
        log.info(
            "initialised private PostgreSQL",
            extra={"event": "db.initdb", "data_dir": str(self.data_dir)},
        )
        return info

    def _is_running(self, info: ClusterInfo) -> bool:
        result = subprocess.run(
            _as_server_user([str(info.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "status"]),
            capture_output=True,
            text=True,
            check=False,
        )
        return result.returncode == 0 and _port_open(info.port)

    def _start(self, info: ClusterInfo) -> ClusterInfo:
        pid_file = self.data_dir / "postmaster.pid"
        if pid_file.exists():
            # pg_ctl status said not running: the pid file is a crash leftover.
            log.warning("removing stale postmaster.pid", extra={"event": "db.stale_pid"})
            pid_file.unlink()
        if not _port_free(info.port):
            info = dataclasses.replace(info, port=free_port())
            self._save(info)
        self.log_file.touch(mode=0o600)
        self.log_file.chmod(0o600)  # also a log left by an older version
        self._chown_to_server_user(self.log_file)
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={info.port} -c unix_socket_directories='' "
            "-c max_connections=200 -c fsync=on -c shared_buffers=256MB "
            "-c max_prepared_transactions=0"
        ) + "".join(f" -c {name}={value}" for name, value in self.server_settings.items())
        self._run(
            [
                str(info.bin_dir / "pg_ctl"),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        _wait_for_port(info.port, timeout_s=30)
        self._create_database(info)
        log.info("started private PostgreSQL", extra={"event": "db.started", "port": info.port})
        return info

    def _create_database(self, info: ClusterInfo) -> None:
        """As the bootstrap superuser: the application role, with only these grants,
        and the ``outbox`` database it owns (both made once; the password set each
        start, so the role always matches ``cluster.json``).

        - LOGIN, with a SCRAM password;
        - CREATEDB: the demo, the tests and the benches create scratch databases,
          cloned from a template it marks as one (an owner may);
        - owner of ``outbox``: in PostgreSQL 15 the ``public`` schema belongs to the
          database's owner, so the migrations create and alter the tables there;
        - member of ``pg_signal_backend``: dropping a scratch database ``WITH (FORCE)``
          terminates its sessions, autovacuum's workers among them, which belong to no
          role the owner is a member of (it never reaches a superuser's session);
        - NOSUPERUSER NOCREATEROLE NOREPLICATION NOBYPASSRLS: nothing at run time
          needs more (no extension is created; LISTEN/NOTIFY, advisory locks and
          the session settings the dispatcher sets are open to every role).
        """
        import psycopg2  # local: keeps `outbox db status` free of the driver when not needed
        from psycopg2 import sql

        legacy = info.admin_password is None
        conn = psycopg2.connect(
            host="127.0.0.1",
            port=info.port,
            user=APP_ROLE if legacy else ADMIN_ROLE,
            password=info.password if legacy else info.admin_password,
            dbname="postgres",
        )
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                if legacy:
                    log.warning(
                        "the private cluster's application role is a superuser (made by an "
                        "older version); to re-create it, `outbox db stop` and remove %s",
                        self.data_dir,
                        extra={"event": "db.superuser_role"},
                    )
                else:
                    cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,))
                    verb = "ALTER" if cur.fetchone() else "CREATE"
                    cur.execute(
                        sql.SQL(
                            verb + " ROLE {} LOGIN CREATEDB NOSUPERUSER NOCREATEROLE "
                            "NOREPLICATION NOBYPASSRLS PASSWORD {}"
                        ).format(sql.Identifier(APP_ROLE), sql.Literal(info.password))
                    )
                    cur.execute(
                        sql.SQL("GRANT pg_signal_backend TO {}").format(sql.Identifier(APP_ROLE))
                    )
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,))
                if cur.fetchone() is None:
                    cur.execute(
                        sql.SQL("CREATE DATABASE {} OWNER {}").format(
                            sql.Identifier(DATABASE), sql.Identifier(APP_ROLE)
                        )
                    )
        finally:
            conn.close()


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As PostgreSQL binds: a port whose old connections sit in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_for_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _port_open(port):
            return
        time.sleep(0.05)
    raise DatabaseUnavailable(f"PostgreSQL did not accept connections on 127.0.0.1:{port}")
