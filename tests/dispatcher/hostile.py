"""A hostile webhook receiver: a raw asyncio TCP server that can answer any bytes.

Each request's ``webhook-id`` picks a ``Behaviour``: a well-framed answer with
odd bytes in the status line, headers and body; raw garbage; an endless
chunked body; a header line too long for any parser; a drip; silence; a reset;
a close without a word; interim 1xx answers before the framed one; a status
line followed by a broken header line; a chunked body that ends in an endless
trailer section. Every request is logged with its arrival time
(``time.time()``, the same clock PostgreSQL's ``now()`` reads on this host).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
import time

KINDS = (
    "answer",
    "garbage",
    "endless",
    "long_header",
    "drip",
    "silence",
    "reset",
    "close",
    "interim",
    "broken_head",
    "trailers",
)
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
TRAILERS_OFFERED = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Behaviour:
    kind: str
    status: int = 200
    reason: bytes = b"OK"
    headers: tuple[tuple[bytes, bytes], ...] = ()
    body: bytes = b""

    def answer(self) -> bytes:
        """A response framed by Content-Length, whatever bytes it carries."""
        lines = [b"HTTP/1.1 %d %s" % (self.status, self.reason.replace(b"\r\n", b" "))]
        lines += [name + b": " + value for name, value in self.headers]
        lines.append(b"Content-Length: %d" % len(self.body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + self.body


class HostileReceiver:
    def __init__(self) -> None:
        self.behaviours: dict[str, Behaviour] = {}
        self.arrivals: list[tuple[str, float]] = []  # (webhook-id, time.time())
        self.port = 0
        self._server: asyncio.base_events.Server | None = None

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await self._one(reader, writer):
                pass
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; True when the connection may carry another."""
        head = await reader.readuntil(b"\r\n\r\n")
        headers = _headers(head)
        key = headers.get("webhook-id", "")
        self.arrivals.append((key, time.time()))
        await reader.readexactly(int(headers.get("content-length", "0")))
        b = self.behaviours.get(key, Behaviour("answer"))
        if b.kind in ("answer", "interim"):
            writer.write((INTERIM if b.kind == "interim" else b"") + b.answer())
            await writer.drain()
            return True
        await _misbehave(b, reader, writer)
        return False


async def _misbehave(
    b: Behaviour, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    if b.kind == "garbage":
        writer.write(b.body)
    elif b.kind == "long_header":
        writer.write(b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 20000 + b"\r\n\r\n")
    elif b.kind == "endless":
        writer.write(b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n" % b.status)
        for _ in range(10000):  # ~40 MB at most; the client hangs up long before
            writer.write(b"1000\r\n" + b"\x00\xff" * 2048 + b"\r\n")
            await writer.drain()
    elif b.kind == "broken_head":
        writer.write(b"HTTP/1.1 %d X\r\nthis is no header line\r\n\r\n" % b.status)
    elif b.kind == "trailers":
        writer.write(
            b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n" % b.status
        )
        line = b"X-Trailer: " + b"t" * 4096 + b"\r\n"
        for _ in range(TRAILERS_OFFERED // len(line) // 16):  # the client hangs up long before
            writer.write(line * 16)
            await writer.drain()
        writer.write(b"\r\n")
    elif b.kind == "drip":
        for byte in b.answer():
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.05)
    elif b.kind == "silence":
        await reader.read()  # until the client gives up and closes
    elif b.kind == "reset":
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    await writer.drain()


def _headers(head: bytes) -> dict[str, str]:
    found = {}
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        found[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return found
