"""The bench's webhook receiver: uvicorn (uvloop + httptools), one process, 200 to all.

It stands for a fast third party and does not verify signatures. Arrivals of
requests to ``/lat`` are noted (``webhook-id`` or ``x-key``, ``time.time()``)
and handed out (and forgotten) by ``GET /arrivals``: the latency bench measures
from the producer's COMMIT to the receiver, on one clock.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spark_outbox.cli.tools.scratch import free_port

ROOT = Path(__file__).resolve().parents[1]
_ARRIVALS: list[tuple[str, float]] = []
_OK = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}


async def app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/lat":
        at = time.time()
        headers = dict(scope["headers"])
        _ARRIVALS.append((headers.get(b"webhook-id", b"").decode(), at))
    more = True
    while more:
        message = await receive()
        more = bool(message.get("more_body"))
    if scope["path"] == "/arrivals":
        body = json.dumps(_ARRIVALS).encode()
        _ARRIVALS.clear()
        start = _OK | {"headers": [(b"content-length", str(len(body)).encode())]}
        await send(start)
        await send({"type": "http.response.body", "body": body})
        return
    await send(_OK)
    await send({"type": "http.response.body", "body": b"ok"})


def wait_port(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@contextmanager
def serve() -> Iterator[tuple[str, int]]:
    """The receiver in its own process; yields its base URL (``http://127.0.0.1:PORT``)
    and its pid."""
    port = free_port()
    args = ["--port", str(port), "--host", "127.0.0.1", "--loop", "uvloop", "--http", "httptools"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.receiver:app",
            *args,
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    try:
        wait_port(port)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(10)
