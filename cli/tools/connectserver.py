"""A private Spark Connect server on loopback, from the installed PySpark.

PySpark ships the server (``spark-connect_*.jar``, the class
``org.apache.spark.sql.connect.service.SparkConnectServer`` that
``sbin/start-connect-server.sh`` submits): nothing to download. This starts it in
the foreground through ``spark-submit`` on a free port, bound to 127.0.0.1, on
any master (``local[2]``, or a standalone cluster's URL), and stops it, or kills
it with its Python workers as a lost host would. Used by the Connect tests.

    with ConnectServer(tmp, master="local[2]") as server:
        spark = SparkSession.builder.remote(server.url).create()
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from spark_outbox.cli.tools.scratch import free_port

HOST = "127.0.0.1"
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
STARTED = "Spark Connect server started"


def spark_submit() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent / "bin" / "spark-submit"


class ConnectServer:
    def __init__(
        self,
        work_dir: Path,
        *,
        master: str = "local[2]",
        env: dict[str, str | None] | None = None,
        conf: dict[str, str] | None = None,
    ) -> None:
        """``env`` adds to (or, with a value of None, removes from) this process's
        environment for the server and so its Python workers; ``conf`` adds Spark conf."""
        self.work_dir = work_dir
        self.master = master
        merged = {
            **os.environ,
            "SPARK_LOCAL_IP": HOST,
            # The server's Python workers (foreachBatch, UDFs, data sources) run this
            # interpreter, whose environment has the package, unless env says otherwise.
            "PYSPARK_PYTHON": sys.executable,
            **(env or {}),
        }
        self.env = {k: v for k, v in merged.items() if v is not None}
        self.conf = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.driver.host": HOST,
            "spark.ui.enabled": "false",
            "spark.sql.session.timeZone": "UTC",
            "spark.sql.shuffle.partitions": "4",
            # A Python worker (foreachBatch's, a data source's) must connect back within
            # this; 15 s by default, which a loaded 2-core machine has missed.
            "spark.python.authenticate.socketTimeout": "120s",
            **(conf or {}),
        }
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / f"connect-{self.starts}.log"

    def start(self, timeout_s: float = 120) -> ConnectServer:
        """Start (or start again, on the same port) and wait until it takes clients."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        command = [str(spark_submit()), "--class", SERVER_CLASS, "--master", self.master]
        command += ["--name", "spark-outbox-connect"]
        conf = {**self.conf, "spark.connect.grpc.binding.port": str(self.port)}
        for key, value in conf.items():
            command += ["--conf", f"{key}={value}"]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            command,
            cwd=self.work_dir,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # stop() and kill() reach the JVM and its Python workers
        )
        self._wait_until_serving(timeout_s)
        return self

    def _wait_until_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while time.monotonic() < deadline:
            if STARTED in self.log() and _listening(self.port):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"the Spark Connect server did not come up: {self.log()[-3000:]}")

    def log(self) -> str:
        """This start's server log (the JVM's, and its Python workers' stderr)."""
        path = self.log_path
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self) -> None:
        """SIGKILL the server's JVM and every Python worker it started: a lost host."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reap()

    def _reap(self) -> None:
        if self.proc is None:
            return
        self.proc.wait(timeout=30)
        # Python workers the JVM left behind share its session: end them too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc = None

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((HOST, port)) == 0
