"""A lean HTTP/1.1 client for the webhook channel: an asyncio Protocol and httptools.

Why not aiohttp: measured here, aiohttp costs ~110-120 CPU microseconds per POST in
the dispatcher's process, the largest part of a delivery (bench/RESULTS.md). The send
path needs little of it: one POST with a small body, keep-alive, a status and a
short excerpt of the answer. httptools (llhttp, the C parser uvicorn uses) parses
the answer; everything else is a few lines here.

What it does (docs/dispatcher.md, "Webhook client"):
- a keep-alive pool per (scheme, host, port), at most ``pool_size`` idle
  connections in all; a connection is reused only after a complete answer that
  allows it, and only within ``IDLE_REUSE_S`` of it, or within half the idle
  timeout a ``Keep-Alive: timeout=N`` header announces where that is shorter, or
  within half the idle time after which a reused connection to that receiver
  died unanswered (learned, for ``LEARNED_TTL_S``);
- TLS through one ``ssl`` context (certificates and host names verified);
- the SSRF guard judges every address before the socket connects to it;
- one total deadline per send (connect, write, answer);
- chunked and Content-Length bodies, or a body up to the close; the body read
  stops at ``EXCERPT_BYTES`` (the connection is closed then, not reused);
- response heads over ``MAX_HEAD_BYTES`` are refused; redirects never followed;
- every failure is a ``Failure`` carrying whether the request was completely
  written to the socket before it happened, with no status line yet
  (``handed_over``: the receiver may have acted on it).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import ssl
import time
import typing
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

import httptools

from spark_outbox.core.outside import EXCERPT_BYTES
from spark_outbox.dispatch import ssrf

# The largest response head (status line and headers) accepted; aiohttp's and
# most servers' limits are about 8 KiB per line.
MAX_HEAD_BYTES = 16384
DNS_TTL_S = 60.0
# A pooled connection idle longer than this is closed, not reused. Receivers close
# idle connections after their own timeout (gunicorn 2 s, uvicorn and Node 5 s,
# nginx 75 s); a request sent as that close is on its way dies with no answer,
# handed over (uncertain where the endpoint cannot deduplicate). Measured here: a
# server closing after 50 ms idle, connections reused 50 +- 2 ms later: 117 of 400
# sends failed so. Below the shortest common timeout, so the race is not run.
IDLE_REUSE_S = 1.5
# A receiver that announces its idle timeout (``Keep-Alive: timeout=N``, RFC 2068
# 19.7.1; Apache and Node send it) is trusted to close no earlier: a connection
# is reused only within half of it (if that is shorter than the limit above). Only
# the first ``timeout=`` of up to 7 digits counts; anything else is ignored.
_KEEP_ALIVE_TIMEOUT = re.compile(r"(?:^|[,;\s])timeout\s*=\s*([0-9]{1,7})(?![0-9])", re.I)


# A receiver that does not announce its idle timeout and closes sooner than the
# limit above: a reused connection that dies before any answer, after sitting idle
# t seconds, teaches the client that this receiver's idle timeout may be under t.
# Its connections are then reused only within t/2 (never below LEARNED_FLOOR_S),
# for LEARNED_TTL_S (a restart of the receiver looks the same once: it is not kept
# for ever). The send that taught it still failed (handed over, as before).
LEARNED_FLOOR_S = 0.025
LEARNED_TTL_S = 600.0


def _reuse_limit(answer: Answer, limit_s: float) -> float:
    """How long the connection that carried ``answer`` may sit idle and still be
    reused: ``limit_s``, or half the receiver's announced idle timeout if shorter
    (``timeout=0``: not at all)."""
    found = _KEEP_ALIVE_TIMEOUT.search(answer.header("Keep-Alive") or "")
    return limit_s if found is None else min(limit_s, int(found.group(1)) / 2)


class Failure(Exception):
    """A send that produced no usable answer (or a broken body after the status).

    ``kind``: ``Timeout``, ``ConnectFailed``, ``SsrfRefused``, ``InvalidUrl``,
    ``BadResponse`` (the answer broke HTTP/1.1) or ``Disconnected``.
    """

    def __init__(self, kind: str, detail: str, *, handed_over: bool = False) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.handed_over = handed_over


class Answer:
    """A status, the headers as sent (names and values decoded, raw), the body's start."""

    __slots__ = ("body", "body_error", "headers", "reason", "status")

    def __init__(self) -> None:
        self.status = 0
        self.reason = ""
        self.headers: list[tuple[str, str]] = []
        self.body = bytearray()
        self.body_error: str | None = None  # the body broke off or timed out after the status

    def header(self, name: str) -> str | None:
        lowered = name.lower()
        for key, value in self.headers:
            if key.lower() == lowered:
                return value
        return None


class Target:
    """An endpoint URL parsed once: the pool key, the Host header, the request target."""

    __slots__ = ("host", "host_header", "key", "path", "port", "tls")

    def __init__(self, url: str) -> None:
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise Failure("InvalidUrl", f"{url!r}: {exc}; fix the endpoint's URL") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Failure(
                "InvalidUrl", f"{url!r} is not an http(s) URL with a host; fix the endpoint's URL"
            )
        if any(c in url for c in "\r\n\t ") or not url.isascii():
            raise Failure("InvalidUrl", f"{url!r} has spaces or non-ASCII characters")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.tls else 80)
        self.key = (self.tls, self.host, self.port)
        name = f"[{self.host}]" if ":" in self.host else self.host
        default = self.port == (443 if self.tls else 80)
        self.host_header = name if default else f"{name}:{self.port}"
        path = parts.path or "/"
        self.path = f"{path}?{parts.query}" if parts.query else path


class _Conn(asyncio.Protocol):
    """One connection; one request at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reuse_until = 0.0  # time.monotonic() after which it is closed, not reused
        self.idle_since = 0.0  # time.monotonic() when it last went back to the pool
        self._parser = httptools.HttpResponseParser(self)
        self._answer: Answer | None = None
        self._done: asyncio.Future[Answer] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._head_bytes = 0  # bytes received while the head was incomplete
        self._head_size = 0  # the head's status and header bytes, as parsed
        self._headers_done = False
        self._status_seen = False
        self._complete = False
        self._reusable = False
        self._written = False  # the whole request reached the socket
        # What a deadline cut (``send`` reads them): was the request handed over,
        # had the status and headers arrived (then the status decides the outcome)?
        self.cut_handed_over = False
        self.cut_after_head = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses; same methods.)
        if self.transport is transport:
            return
        self.transport = typing.cast(asyncio.Transport, transport)
        # Told when the write buffer empties: the request has reached the socket.
        self.transport.set_write_buffer_limits(high=0)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(
                Failure("Disconnected", f"connection lost while sending: {exc!r}")
            )
        if self._done is None or self._done.done():
            return
        answer = self._answer
        if answer is not None and self._headers_done:
            # No length and not chunked: the body runs to the close (HTTP/1.1 allows it).
            if exc is not None:
                answer.body_error = f"body unreadable: connection lost ({type(exc).__name__})"
            elif self._parser.should_keep_alive() and not self._complete:
                answer.body_error = "body unreadable: the connection closed mid-body"
            self._done.set_result(answer)
            return
        what = "before an answer" if not self._status_seen else "in the middle of the answer head"
        self._done.set_exception(
            Failure("Disconnected", f"the receiver closed the connection {what}")
        )

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self._done is None or self._done.done():
            # Bytes nobody asked for (after an answer, or on an idle connection).
            self._reusable = False
            self.close()
            return
        if not self._headers_done:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(Failure("BadResponse", "the receiver asked to switch protocols"))
            return
        except httptools.HttpParserError as exc:
            self._fail(Failure("BadResponse", f"{type(exc).__name__}: {exc}"))
            return
        if not self._headers_done and self._head_bytes > MAX_HEAD_BYTES:
            self._fail(
                Failure("BadResponse", f"response head over {MAX_HEAD_BYTES} bytes: refused")
            )

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost settles the answer

    # httptools callbacks
    def _settled(self) -> bool:
        """Has this exchange's answer been handed back? Then more bytes are a second
        answer nobody asked for: ignored, and the connection is not reused."""
        if self._done is None or self._done.done():
            self._reusable = False
            return True
        return False

    def on_status(self, status: bytes) -> None:
        if self._settled():
            return
        self._status_seen = True
        self._head_size += len(status)
        if self._answer is not None:
            self._answer.reason += status.decode("utf-8", "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._settled():
            return
        self._status_seen = True
        self._head_size += len(name) + len(value) + 4
        answer = self._answer
        if answer is None:
            return
        # llhttp may hand a header over in pieces (a name split across reads).
        if name:
            answer.headers.append(
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            )
        elif answer.headers:
            last_name, last_value = answer.headers[-1]
            answer.headers[-1] = (last_name, last_value + value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        if self._settled():
            return
        self._status_seen = self._headers_done = True
        if self._head_size > MAX_HEAD_BYTES:
            self._fail(
                Failure("BadResponse", f"response head over {MAX_HEAD_BYTES} bytes: refused")
            )
            return
        if self._answer is not None:
            self._answer.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        answer, done = self._answer, self._done
        if answer is None or done is None or self._settled():
            return
        room = EXCERPT_BYTES - len(answer.body)
        answer.body += body[:room]
        if len(body) >= room:
            # Enough for the excerpt: the rest is not read (nor the connection reused).
            done.set_result(answer)
            self.close()

    def on_message_complete(self) -> None:
        if self._settled():
            return
        self._complete = True
        self._reusable = self._parser.should_keep_alive()
        if self._done is not None and self._answer is not None:
            self._done.set_result(self._answer)

    # ours
    def _fail(self, failure: Failure) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_exception(failure)
        self.close()

    def close(self) -> None:
        self._reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.close()

    @property
    def reusable(self) -> bool:
        return self._reusable and not self.closed

    @property
    def status_seen(self) -> bool:
        """Did any byte of an answer's status line or head arrive in this exchange?"""
        return self._status_seen

    async def exchange(self, request: bytes, deadline: float) -> Answer:
        """Write ``request``, return the answer; ``Failure`` says whether it was handed
        over; ``TimeoutError`` at ``deadline`` (the loop's clock), the connection closed.

        The deadline is a timer of the exchange's own, not ``asyncio.timeout``: the
        same cut for a fraction of the cost (a context manager and a task's cancel
        machinery per send, ~5 us of the process's CPU, measured on uvloop)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._answer, self._done = Answer(), loop.create_future()
        self._head_bytes, self._head_size = 0, 0
        self._headers_done, self._status_seen = False, False
        self._complete = self._reusable = self._written = False
        self._drained = None
        timer = loop.call_at(deadline, self._expire)
        try:
            self.transport.write(request)
            if self._drained is not None:
                await self._drained  # the kernel took the rest of the request
            self._written = True
            return await self._done
        except Failure as failure:
            failure.handed_over = self._written and not self._status_seen
            raise
        except TimeoutError:
            raise  # _expire: the cut is noted and the connection closed
        except BaseException:
            # A cancel: the answer is abandoned with the connection.
            self._cut()
            raise
        finally:
            timer.cancel()

    def _cut(self) -> None:
        """Abandon the exchange: note how far it got, close the connection."""
        self.cut_handed_over = self._written and not self._status_seen
        self.cut_after_head = self._headers_done
        self.close()

    def _expire(self) -> None:
        """The exchange's deadline: whatever it awaits fails with ``TimeoutError``."""
        done = self._done
        if done is None or done.done():
            return
        self._cut()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(TimeoutError())
        if not done.done():  # (closing may have settled it: connection_lost)
            done.set_exception(TimeoutError())
            if not self._written:
                done.exception()  # awaited by nobody: the write was cut first

    @property
    def answer(self) -> Answer | None:
        return self._answer


class Client:
    """Sends POSTs; safe to use from many tasks at once."""

    def __init__(
        self,
        pool_size: int,
        allow: Sequence[ssrf.Network],
        ssl_context: ssl.SSLContext | None,
        idle_reuse_s: float = IDLE_REUSE_S,
    ) -> None:
        self._pool_size = pool_size
        self._idle_reuse_s = idle_reuse_s
        self._allow = allow
        self._ssl = ssl_context
        self._idle: dict[tuple[bool, str, int], list[_Conn]] = {}
        self._idle_count = 0
        self._dns: dict[tuple[str, int], tuple[float, list[tuple[Any, ...]]]] = {}
        self._targets: dict[str, Target] = {}
        # Per (scheme, host, port): (idle limit learned from a lost reuse, until when).
        self._learned: dict[tuple[bool, str, int], tuple[float, float]] = {}

    def target(self, url: str) -> Target:
        found = self._targets.get(url)
        if found is None:
            if len(self._targets) > 4096:
                self._targets.clear()
            found = self._targets[url] = Target(url)
        return found

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()
        self._idle_count = 0

    async def post(
        self, target: Target, headers: Iterable[tuple[str, str]], body: bytes, timeout_s: float
    ) -> Answer:
        """One POST under one total deadline: the answer, or ``Failure``.

        An answer whose body broke off after the status line is still an answer
        (``body_error`` says what happened); a deadline after the status line too.
        """
        request = _request(target, headers, body)
        deadline = asyncio.get_running_loop().time() + timeout_s
        conn = self._checkout(target.key)
        reused = conn is not None
        try:
            if conn is None:
                async with asyncio.timeout_at(deadline):
                    conn = await self._connect(target)
            try:
                answer = await conn.exchange(request, deadline)
            except Failure as failure:
                if reused and failure.kind == "Disconnected" and not conn.status_seen:
                    self._learn(target.key, time.monotonic() - conn.idle_since)
                raise
        except TimeoutError:
            if conn is not None and conn.cut_after_head and conn.answer is not None:
                conn.answer.body_error = "body unreadable: TimeoutError"
                return conn.answer
            handed = conn is not None and conn.cut_handed_over
            raise Failure("Timeout", f"no answer in {timeout_s:.3g}s", handed_over=handed) from None
        if conn.reusable:
            self._checkin(target.key, conn, _reuse_limit(answer, self._idle_reuse_s))
        else:
            conn.close()
        return answer

    def _checkout(self, key: tuple[bool, str, int]) -> _Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            conn = conns.pop()
            self._idle_count -= 1
            if conn.closed:
                continue
            if conn.reuse_until < now:
                conn.close()  # the receiver may be closing it right now (IDLE_REUSE_S)
                continue
            return conn
        return None

    def _learn(self, key: tuple[bool, str, int], idle_s: float) -> None:
        """A reused connection idle ``idle_s`` died before any answer (see LEARNED_FLOOR_S)."""
        now = time.monotonic()
        limit_s = max(LEARNED_FLOOR_S, idle_s / 2)
        known = self._learned.get(key)
        if known is not None and known[1] > now:
            limit_s = min(limit_s, known[0])
        if len(self._learned) > 4096:
            self._learned.clear()
        self._learned[key] = (limit_s, now + LEARNED_TTL_S)

    def idle_limit(self, key: tuple[bool, str, int]) -> float:
        """How long a pooled connection to ``key`` may sit idle (for a receiver that
        announces nothing): the client's limit, or what a lost reuse taught, if shorter."""
        known = self._learned.get(key)
        if known is None or known[1] <= time.monotonic():
            return self._idle_reuse_s
        return min(self._idle_reuse_s, known[0])

    def _checkin(self, key: tuple[bool, str, int], conn: _Conn, limit_s: float) -> None:
        if key in self._learned:
            limit_s = min(limit_s, self.idle_limit(key))
        if self._idle_count >= self._pool_size or limit_s <= 0:
            conn.close()
            return
        now = time.monotonic()
        conn.idle_since = now
        conn.reuse_until = now + limit_s
        self._idle.setdefault(key, []).append(conn)
        self._idle_count += 1

    async def _addresses(self, host: str, port: int) -> list[tuple[Any, ...]]:
        now = time.monotonic()
        cached = self._dns.get((host, port))
        if cached is not None and cached[0] > now:
            return cached[1]
        loop = asyncio.get_running_loop()
        try:
            ipaddress.ip_address(host)
            literal = True
        except ValueError:
            literal = False
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise Failure("ConnectFailed", f"cannot resolve {host!r}: {exc}") from exc
        if len(self._dns) > 1024:
            self._dns.clear()
        self._dns[(host, port)] = (now + (1e9 if literal else DNS_TTL_S), infos)
        return infos

    async def _connect(self, target: Target) -> _Conn:
        loop = asyncio.get_running_loop()
        last: Exception | None = None
        for family, type_, proto, _, sockaddr in await self._addresses(target.host, target.port):
            try:
                ssrf.check(str(sockaddr[0]), self._allow)
            except ssrf.SsrfRefused as exc:
                raise Failure("SsrfRefused", str(exc)) from exc
            sock = socket.socket(family, type_, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, sockaddr)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                tls = self._ssl if target.tls else None
                transport, conn = await loop.create_connection(
                    _Conn, sock=sock, ssl=tls, server_hostname=target.host if tls else None
                )
                # uvloop may call connection_made only after create_connection returns.
                conn.connection_made(transport)
                return conn
            except ssl.SSLError as exc:
                sock.close()
                raise Failure("ConnectFailed", f"TLS: {exc}") from exc
            except OSError as exc:
                sock.close()
                last = exc
            except BaseException:
                sock.close()
                raise
        raise Failure(
            "ConnectFailed", f"cannot connect to {target.host}:{target.port}: {last!r}"
        ) from last


def _request(target: Target, headers: Iterable[tuple[str, str]], body: bytes) -> bytes:
    lines = [
        f"POST {target.path} HTTP/1.1\r\nHost: {target.host_header}\r\n"
        f"Content-Length: {len(body)}\r\n"
    ]
    for name, value in headers:
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise Failure("InvalidHeader", f"header {name!r} carries a line break or colon")
        lines.append(f"{name}: {value}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1") + body
    except UnicodeEncodeError as exc:
        raise Failure("InvalidHeader", f"a header is not Latin-1 text: {exc}") from exc
