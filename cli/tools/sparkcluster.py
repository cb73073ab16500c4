"""A private Spark standalone cluster on loopback, from the installed PySpark.

One master and N workers, each a JVM started with PySpark's own ``spark-class``
launcher (``org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker``):
nothing to download. Every process binds 127.0.0.1; the workers get one core and
a little memory each, so executors are separate JVMs that can die on their own,
as on a real cluster. Used by the cluster tests and by
``python -m bench sink --master cluster``.

On a busy machine nothing about a port can be assumed: a port free a moment ago
may be taken (Spark then binds the next one), and whatever answers on a port may
be another program. So the master's ports are read from its own log before any
worker starts, and a status answer counts only if it is JSON naming our master.
Every process it starts is stopped whatever happens: ``start`` stops what it
started when it fails (``with`` never sees a half-started cluster), ``stop``
kills every process left in their sessions (executors included), and each JVM
gets SIGKILL from the kernel if the process that started it dies first.

    with StandaloneCluster(workers=2, work_dir=tmp) as cluster:
        run_a_job(master=cluster.master_url)
        os.kill(cluster.executor_pids()[0], signal.SIGKILL)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Collection, Iterator
from pathlib import Path
from types import TracebackType

from spark_outbox.cli.tools.scratch import free_port

# The master's log lines naming the ports it finally bound (the asked-for one, or
# the next free one when another process holds it).
_MASTER_RPC = re.compile(r"Successfully started service 'sparkMaster' on port (\d+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
_PR_SET_PDEATHSIG = 1
HOST = "127.0.0.1"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-class"


class StandaloneCluster:
    def __init__(
        self,
        work_dir: Path,
        *,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        env: dict[str, str | None] | None = None,
        port: int | None = None,
        ui_port: int | None = None,
    ) -> None:
        """``env`` adds to (or, with a value of None, removes from) this process's
        environment for the master, the workers and so their executors. ``port`` and
        ``ui_port`` are the master's ports to ask for (free ones by default); the
        ones it binds are read from its log."""
        self.work_dir = work_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        merged = {
            **os.environ,
            "SPARK_LOCAL_IP": HOST,
            "SPARK_DAEMON_MEMORY": "256m",
            **(env or {}),
        }
        self.env = {k: v for k, v in merged.items() if v is not None}
        self.port = port or free_port()
        self.ui_port = ui_port or free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sessions: set[int] = set()  # every process started, a session leader

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def start(self, timeout_s: float = 90) -> StandaloneCluster:
        """The master, then (once its log names its ports) the workers; stopped again
        if any of it fails, so a failed start leaves nothing running."""
        deadline = time.monotonic() + timeout_s
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            master = ["org.apache.spark.deploy.master.Master", "--host", HOST]
            master += ["--port", str(self.port), "--webui-port", str(self.ui_port)]
            self._launch("master", master)
            self.port, self.ui_port = self._wait_for_master(deadline)
            for n in range(self.workers):
                worker = ["org.apache.spark.deploy.worker.Worker", self.master_url]
                worker += ["--host", HOST, "--cores", str(self.cores), "--memory", self.memory]
                worker += [
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(self.work_dir / "work"),
                ]
                self._launch(f"worker-{n}", worker)
            self._wait_for_workers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _launch(self, name: str, args: list[str]) -> None:
        with (self.work_dir / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(spark_class()), *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stop() ends the launcher, its JVM and executors
                preexec_fn=_die_with_parent,
            )
        self.procs.append(proc)
        self.sessions.add(proc.pid)

    def _wait_for_master(self, deadline: float) -> tuple[int, int]:
        """The master's RPC and status ports, from its log."""
        log = self.work_dir / "master.log"
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace") if log.exists() else ""
            rpc, ui = _MASTER_RPC.findall(text), _MASTER_UI.findall(text)
            if rpc and ui:
                return int(rpc[-1]), int(ui[-1])
            if self.procs[0].poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the Spark master did not come up: {self._log_tails()}")

    def _wait_for_workers(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.alive_workers() == self.workers:
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        raise RuntimeError(f"the standalone cluster did not come up: {self._log_tails()}")

    def _log_tails(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace")[-2000:] for p in self.work_dir.glob("*.log")}

    def alive_workers(self) -> int:
        """From the master's status page (JSON), on loopback. Whatever else answers
        there (an HTML page, another master, a half-written reply) counts as none."""
        try:
            url = f"http://{HOST}:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as answer:
                status = json.loads(answer.read(1_000_000))
        except (OSError, ValueError):  # refused, reset, timed out; not JSON
            return 0
        if not isinstance(status, dict) or status.get("url") != self.master_url:
            return 0
        alive = status.get("aliveworkers")
        return alive if isinstance(alive, int) else 0

    def apps(self) -> set[str]:
        """The applications that ran executors here (``work/<app>``), finished ones too:
        a cluster shared by several jobs tells one job's executors from another's."""
        return {app.name for app in (self.work_dir / "work").glob("app-*")}

    def executor_logs(self, apps: Collection[str] | None = None) -> str:
        """Every executor's stderr (``work/<app>/<executor>/stderr``), one after another;
        only those of ``apps`` when given."""
        logs = sorted((self.work_dir / "work").glob("*/*/stderr"))
        chosen = [log for log in logs if apps is None or log.parent.parent.name in apps]
        return "".join(log.read_text(errors="replace") for log in chosen)

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs our workers launched: found by their command line,
        in the session of one of our workers (each was started as a session leader)."""
        workers = {p.pid for p in self.procs[1:]}
        return sorted(
            pid
            for pid, cmdline, sid in _processes()
            if sid in workers and EXECUTOR_CLASS.encode() in cmdline
        )

    def pids(self) -> list[int]:
        """Every live process of the cluster: launchers, JVMs, executors, their Python."""
        return sorted(pid for pid, _, sid in _processes() if sid in self.sessions)

    def stop(self) -> None:
        """SIGTERM to every session, SIGKILL to what is left after a grace period;
        safe to call again, and after a failed start."""
        for proc in self.procs:
            _signal_group(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:  # an executor that outlived its worker, in the same session
                _signal_pid(pid, signal.SIGKILL)
            time.sleep(0.1)
        self.procs.clear()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _die_with_parent() -> None:
    """In the child before exec: the kernel SIGKILLs it if this process dies (a test
    runner killed, a crash), so no JVM outlives the run that started it. (The signal
    follows the starting thread: start a cluster from a thread that outlives it.)"""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _processes() -> Iterator[tuple[int, bytes, int]]:
    """(pid, command line, session id) of every process that can be read."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            yield int(proc.name), (proc / "cmdline").read_bytes(), os.getsid(int(proc.name))
        except OSError:
            continue


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _signal_pid(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, signum)
