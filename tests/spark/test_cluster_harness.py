"""The standalone cluster harness on a busy machine: ports others hold, whatever
answers on a port, a failed start, and the death of the process that started it.
No process it started may outlive it."""

from __future__ import annotations

import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_outbox.cli.tools.sparkcluster import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]


class _Answers(http.server.BaseHTTPRequestHandler):
    body = b"<html><body>not a Spark master</body></html>"

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        return


class _OtherMaster(_Answers):
    body = json.dumps({"url": "spark://127.0.0.1:1", "aliveworkers": 7}).encode()


def _serve(handler: type[_Answers]) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def html_port() -> Iterator[int]:
    yield from _serve(_Answers)


@pytest.fixture
def other_master_port() -> Iterator[int]:
    yield from _serve(_OtherMaster)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on (it never answers)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def _gone(pids: list[int], timeout_s: float = 20) -> list[int]:
    """The pids still alive after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
        time.sleep(0.2)
    return alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return False


def test_an_html_page_or_another_master_on_the_status_port_counts_as_no_workers(
    tmp_path: Path, html_port: int, other_master_port: int
) -> None:
    for port in (html_port, other_master_port):
        cluster = StandaloneCluster(tmp_path, ui_port=port)
        assert cluster.alive_workers() == 0


def test_a_cluster_whose_ports_others_hold_comes_up_on_the_next_ones_and_stops_clean(
    tmp_path: Path, taken_port: int, html_port: int
) -> None:
    with StandaloneCluster(tmp_path, workers=1, port=taken_port, ui_port=html_port) as cluster:
        assert (cluster.port, cluster.ui_port) != (taken_port, html_port)
        assert cluster.port != taken_port and cluster.ui_port != html_port
        assert cluster.alive_workers() == 1
        started = cluster.pids()
        assert len(started) >= 2, started
    assert _gone(started) == []


def test_a_failed_start_leaves_no_process_running(tmp_path: Path) -> None:
    cluster = StandaloneCluster(tmp_path, workers=1, memory="no-such-size")
    with pytest.raises(RuntimeError, match="did not come up"):
        cluster.start(timeout_s=120)
    assert cluster.sessions and cluster.pids() == []


def test_the_cluster_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    script = (
        "import json, sys, time\n"
        "from pathlib import Path\n"
        "from spark_outbox.cli.tools.sparkcluster import StandaloneCluster\n"
        f"cluster = StandaloneCluster(Path({str(tmp_path)!r}), workers=1).start()\n"
        "print(json.dumps(cluster.pids()), flush=True)\n"
        "time.sleep(600)\n"
    )
    starter = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert starter.stdout is not None
        pids = json.loads(starter.stdout.readline())
        assert len(pids) >= 2, pids
    finally:
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=30)
    assert _gone(pids) == []
