"""A collector stand-in on loopback for the tracing contender: it takes OTLP/HTTP
exports (``POST /v1/traces``) and answers 200, reading each body whole and
decoding nothing (a real collector's work is its own host's; here it would only
take CPU from the dispatcher being measured). It counts what it took."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Taken:
    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0
        self.lock = threading.Lock()


@contextlib.contextmanager
def collector() -> Iterator[tuple[str, Taken]]:
    """(the traces endpoint URL, what it took) while the block runs."""
    taken = Taken()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a collector

        def do_POST(self) -> None:
            size = len(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            with taken.lock:
                taken.requests += 1
                taken.bytes += size
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/traces", taken
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
