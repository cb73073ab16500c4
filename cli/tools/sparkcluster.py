"""A private Spark standalone cluster on loopback, from the installed PySpark.

One master and N workers, each a JVM started with PySpark's own ``spark-class``
launcher (``org.apache.spark.deploy.master.Master`` / ``...deploy.worker.Worker``):
nothing to download. Every process binds 127.0.0.1 on free ports; the workers
get one core and a little memory each, so executors are separate JVMs that
can die on their own, as on a real cluster. Used by the cluster tests and by
``python -m bench sink --master cluster``.

    with StandaloneCluster(workers=2, work_dir=tmp) as cluster:
        run_a_job(master=cluster.master_url)
        os.kill(cluster.executor_pids()[0], signal.SIGKILL)
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from spark_outbox.cli.tools.scratch import free_port

# The master's log line naming the port its status page finally bound.
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
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
    ) -> None:
        """``env`` adds to (or, with a value of None, removes from) this process's
        environment for the master, the workers and so their executors."""
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
        self.port = free_port()
        self.ui_port = free_port()
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def start(self, timeout_s: float = 90) -> StandaloneCluster:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        master = ["org.apache.spark.deploy.master.Master", "--host", HOST]
        master += ["--port", str(self.port), "--webui-port", str(self.ui_port)]
        self._launch("master", master)
        for n in range(self.workers):
            worker = ["org.apache.spark.deploy.worker.Worker", self.master_url, "--host", HOST]
            worker += ["--cores", str(self.cores), "--memory", self.memory]
            worker += ["--webui-port", str(free_port()), "--work-dir", str(self.work_dir / "work")]
            self._launch(f"worker-{n}", worker)
        self._wait_for_workers(timeout_s)
        return self

    def _launch(self, name: str, args: list[str]) -> None:
        log = (self.work_dir / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [str(spark_class()), *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stop() ends the launcher and its JVM together
            )
        )

    def _wait_for_workers(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.alive_workers() == self.workers:
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        self.stop()
        logs = {p.name: p.read_text()[-2000:] for p in self.work_dir.glob("*.log")}
        raise RuntimeError(f"the standalone cluster did not come up: {logs}")

    def _master_ui_port(self) -> int:
        """The port the master's status page is on: the one asked for, unless another
        process took it first (a worker's RPC port, chosen by Spark at random, once
        did) and the master moved on to the next, as its log then says."""
        log = self.work_dir / "master.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        found = _MASTER_UI.findall(text)
        return int(found[-1]) if found else self.ui_port

    def alive_workers(self) -> int:
        """From the master's status page (JSON), on loopback."""
        try:
            url = f"http://{HOST}:{self._master_ui_port()}/json/"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except OSError:
            return 0

    def executor_logs(self) -> str:
        """Every executor's stderr (``work/<app>/<executor>/stderr``), one after another."""
        logs = sorted((self.work_dir / "work").glob("*/*/stderr"))
        return "".join(log.read_text(errors="replace") for log in logs)

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs our workers launched: found by their command line,
        in the session of one of our workers (each was started as a session leader)."""
        sessions = {p.pid for p in self.procs[1:]}
        pids = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
                session = os.getsid(int(proc.name))
            except OSError:
                continue
            if EXECUTOR_CLASS.encode() in cmdline and session in sessions:
                pids.append(int(proc.name))
        return sorted(pids)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
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
