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
- interim answers (1xx: 100 Continue, 103 Early Hints) are skipped, the final
  one read;
- every byte a receiver sends is bounded: the head (interim ones included) and
  the trailer section after a chunked body share ``MAX_HEAD_BYTES``, the body is
  read up to the excerpt; more is refused (``BadResponse``); redirects never followed;
- a connection is a state machine (``State``; every transition in ``_NEXT``);
- every failure is a ``Failure`` carrying how far the exchange got: whether the
  request was completely written to the socket, the status if its line arrived,
  the bytes received (``handed_over``: written and no status line, the receiver
  may have acted on it; ``outcome_unknown``: or an answer broken after its
  status line, see there).
"""

from __future__ import annotations

import asyncio
import enum
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

from spark_outbox.core import masking
from spark_outbox.core.outside import EXCERPT_BYTES
from spark_outbox.dispatch import ssrf

# The largest response head (status line and headers) accepted; aiohttp's and
# most servers' limits are about 8 KiB per line.
MAX_HEAD_BYTES = 16384
_TRAILERS_REFUSED = (
    f"response trailers over {MAX_HEAD_BYTES} bytes with the head: refused "
    "(the receiver's body ended in an oversized trailer section)"
)
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
    """A send that produced no usable answer, with what is known of how far it got.

    ``kind``: ``Timeout``, ``ConnectFailed``, ``SsrfRefused``, ``InvalidUrl``,
    ``InvalidHeader``, ``BadResponse`` (the answer broke HTTP/1.1 or a limit),
    ``Disconnected`` or ``Expired`` (nothing written: the send-by time came first).
    ``written``: the whole request reached the socket.
    ``status``: the answer's status code, if its status line arrived. ``received``:
    the answer's bytes that arrived. ``answer``: the answer, if its whole head
    arrived (a deadline in its body: ``Client.post`` returns it, the status decides).
    """

    def __init__(
        self,
        kind: str,
        detail: str,
        *,
        written: bool = False,
        status: int | None = None,
        received: int = 0,
        answer: Answer | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.written = written
        self.status = status
        self.received = received
        self.answer = answer

    @property
    def handed_over(self) -> bool:
        """The whole request was written and no status line came back: the receiver
        may have acted on it and said nothing."""
        return self.written and self.status is None

    @property
    def outcome_unknown(self) -> bool:
        """Nothing the receiver sent tells whether it acted on the whole request it
        got: no status line, or an answer that broke HTTP after its status line (a
        malformed or oversized head or trailer section). Such an answer is most
        likely what a resend would meet again, so it is not resent blindly where the
        endpoint cannot deduplicate. A connection cut mid-head is not one: a
        network's accident, a resend may well be answered."""
        return self.written and (self.status is None or self.kind == "BadResponse")


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
        shown = masking.masked_url(url)  # the error is stored where support reads it
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise Failure("InvalidUrl", f"{shown!r}: {exc}; fix the endpoint's URL") from exc
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Failure(
                "InvalidUrl", f"{shown!r} is not an http(s) URL with a host; fix the endpoint's URL"
            )
        if any(c in url for c in "\r\n\t ") or not url.isascii():
            raise Failure("InvalidUrl", f"{shown!r} has spaces or non-ASCII characters")
        self.tls = parts.scheme == "https"
        self.host = parts.hostname
        self.port = port or (443 if self.tls else 80)
        self.key = (self.tls, self.host, self.port)
        name = f"[{self.host}]" if ":" in self.host else self.host
        default = self.port == (443 if self.tls else 80)
        self.host_header = name if default else f"{name}:{self.port}"
        path = parts.path or "/"
        self.path = f"{path}?{parts.query}" if parts.query else path


class State(enum.IntEnum):
    """Where a connection is. The states of an exchange follow the answer's
    progress; the request's write runs beside them (a receiver may answer before
    it has read the whole request), so its end is the one fact kept apart
    (``_Conn.written``). Ordered: every test of "how far" is one comparison."""

    IDLE = 0  # open, no exchange: fresh, or pooled after a complete answer
    WRITING = 1  # the request is going out; no byte of an answer yet
    AWAITING_HEAD = 2  # the request was written (or an interim 1xx answer ended)
    READING_HEAD = 3  # the status line arrived; the headers are coming
    READING_BODY = 4  # the head is complete
    # After a chunk's size line until its data: the last chunk (size 0) has none and
    # the trailer section follows; a data chunk's first byte goes back to READING_BODY
    # (httptools does not tell a chunk's size). Its bytes count against MAX_HEAD_BYTES.
    READING_TRAILERS = 5
    DONE = 6  # a complete answer that allows the connection's reuse
    CLOSED = 7  # closed or broken: never used again


IDLE, WRITING, AWAITING_HEAD, READING_HEAD = (
    State.IDLE,
    State.WRITING,
    State.AWAITING_HEAD,
    State.READING_HEAD,
)
READING_BODY, READING_TRAILERS, DONE, CLOSED = (
    State.READING_BODY,
    State.READING_TRAILERS,
    State.DONE,
    State.CLOSED,
)
# Every transition there is (``_Conn._enter`` makes them all); any state may close.
_NEXT: dict[State, tuple[State, ...]] = {
    IDLE: (WRITING,),
    WRITING: (AWAITING_HEAD, READING_HEAD),
    AWAITING_HEAD: (READING_HEAD,),
    READING_HEAD: (READING_BODY, AWAITING_HEAD),  # the head ended, or an interim one did
    READING_BODY: (READING_TRAILERS, DONE),
    READING_TRAILERS: (READING_BODY, DONE),
    DONE: (IDLE,),
    CLOSED: (),
}
# The same as bit masks, for the hot path's check.
_ALLOWED = [sum(1 << to for to in (*_NEXT[s], CLOSED)) for s in State]


class _Conn(asyncio.Protocol):
    """One connection; one request at a time; its state machine is ``State``."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.state = IDLE
        self.written = False  # this exchange's whole request reached the socket
        self.reuse_until = 0.0  # time.monotonic() after which it is closed, not reused
        self.idle_since = 0.0  # time.monotonic() when it last went back to the pool
        self._parser = httptools.HttpResponseParser(self)
        self._answer = Answer()
        self._done: asyncio.Future[Answer] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._timeout_s = 0.0
        self._received = 0  # bytes of this exchange's answer
        # Bytes of the head and trailer sections (MAX_HEAD_BYTES): counted as they
        # arrive while a section is incomplete, and as parsed once the head is whole.
        self._section_bytes = 0
        self._head_size = 0  # the heads' status and header bytes, as parsed

    def _enter(self, state: State) -> None:
        assert _ALLOWED[self.state] >> state & 1, f"{self.state.name} -> {state.name}"
        self.state = state

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses; same methods.)
        if self.transport is transport:
            return
        self.transport = typing.cast(asyncio.Transport, transport)
        # Told when the write buffer empties: the request has reached the socket.
        self.transport.set_write_buffer_limits(high=0)

    def connection_lost(self, exc: Exception | None) -> None:
        state, done, drained = self.state, self._done, self._drained
        if drained is not None and not drained.done():
            drained.set_exception(
                self._failure("Disconnected", f"connection lost while sending: {exc!r}")
            )
        if state == CLOSED or done is None or done.done():
            if state != CLOSED:
                self._enter(CLOSED)
            return  # closed by us (whoever closed it settled the exchange), or idle
        if state < READING_BODY:
            what = (
                "before an answer" if state < READING_HEAD else "in the middle of the answer head"
            )
            # (Told from the state it was lost in, before it closes.)
            failure = self._failure("Disconnected", f"the receiver closed the connection {what}")
            self._enter(CLOSED)
            done.set_exception(failure)
            return
        self._enter(CLOSED)
        # The head arrived: a body without length and not chunked runs to the close
        # (HTTP/1.1 allows it); one with a length or chunks broke off.
        answer = self._answer
        if exc is not None:
            answer.body_error = f"body unreadable: connection lost ({type(exc).__name__})"
        elif self._parser.should_keep_alive():
            answer.body_error = "body unreadable: the connection closed mid-body"
        done.set_result(answer)

    def pause_writing(self) -> None:
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if not WRITING <= state <= READING_TRAILERS:
            # Bytes nobody asked for (after an answer, or on an idle connection).
            self.close()
            return
        self._received += len(data)
        if state <= READING_HEAD or state == READING_TRAILERS:
            self._section_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("BadResponse", "the receiver asked to switch protocols")
            return
        except httptools.HttpParserError as exc:
            self._fail("BadResponse", f"{type(exc).__name__}: {exc}")
            return
        if self._section_bytes > MAX_HEAD_BYTES:
            state = self.state
            if state <= READING_HEAD:
                self._fail("BadResponse", f"response head over {MAX_HEAD_BYTES} bytes: refused")
            elif state == READING_TRAILERS:
                self._fail("BadResponse", _TRAILERS_REFUSED)

    def eof_received(self) -> bool | None:
        return False  # close the transport; connection_lost settles the answer

    # httptools callbacks
    def _in_head(self) -> bool:
        """An answer's head is arriving (moved to READING_HEAD at its first sign);
        False for bytes after the answer was handed back (then a second answer
        nobody asked for: ignored, and the connection is not reused)."""
        state = self.state
        if state == READING_HEAD:
            return True
        if WRITING <= state <= AWAITING_HEAD:
            self._enter(READING_HEAD)
            return True
        self._stray()
        return False

    def _stray(self) -> None:
        if self.state >= DONE:
            self.close()

    def on_status(self, status: bytes) -> None:
        if self.state == READING_HEAD or self._in_head():
            self._head_size += len(status)
            self._answer.reason += status.decode("utf-8", "surrogateescape")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.state != READING_TRAILERS:
            if self.state != READING_HEAD and not self._in_head():
                return
            self._head_size += len(name) + len(value) + 4
        # (Trailers are kept as headers, as sent; their bytes were counted as they came.)
        headers = self._answer.headers
        # llhttp may hand a header over in pieces (a name split across reads).
        if name:
            headers.append(
                (name.decode("utf-8", "surrogateescape"), value.decode("utf-8", "surrogateescape"))
            )
        elif headers:
            last_name, last_value = headers[-1]
            headers[-1] = (last_name, last_value + value.decode("utf-8", "surrogateescape"))

    def on_headers_complete(self) -> None:
        if self.state != READING_HEAD and not self._in_head():
            return
        if self._head_size > MAX_HEAD_BYTES:
            self._fail("BadResponse", f"response head over {MAX_HEAD_BYTES} bytes: refused")
            return
        status = self._parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            return  # an interim answer (100 Continue, 103 Early Hints): see its end
        self._answer.status = status
        self._section_bytes = self._head_size  # the trailers count from here
        self._enter(READING_BODY)

    def on_chunk_header(self) -> None:
        if self.state == READING_BODY:
            self._enter(READING_TRAILERS)  # until this chunk's data, if it has any

    def on_body(self, body: bytes) -> None:
        state = self.state
        if state == READING_TRAILERS:
            self._enter(READING_BODY)  # a chunk with data: no trailers yet
            self._section_bytes = self._head_size
        elif state != READING_BODY:
            self._stray()
            return
        answer, done = self._answer, self._done
        room = EXCERPT_BYTES - len(answer.body)
        answer.body += body[:room]
        if len(body) >= room and done is not None:
            # Enough for the excerpt: the rest is not read (nor the connection reused).
            done.set_result(answer)
            self.close()

    def on_message_complete(self) -> None:
        state, done = self.state, self._done
        if state == READING_HEAD:
            # An interim answer ended: the final one follows (its head bytes still
            # count: an endless run of 1xx answers is refused as an oversized head).
            self._answer.reason = ""
            self._answer.headers.clear()
            self._enter(AWAITING_HEAD)
            return
        if not READING_BODY <= state <= READING_TRAILERS or done is None:
            self._stray()
            return
        if self._parser.should_keep_alive():
            self._enter(DONE)
        else:
            self.close()
        done.set_result(self._answer)

    # ours
    def _failure(self, kind: str, detail: str) -> Failure:
        """A failure now, with what is known of how far the exchange got."""
        state = self.state
        seen = READING_HEAD <= state <= READING_TRAILERS
        return Failure(
            kind,
            detail,
            written=self.written,
            status=self._parser.get_status_code() if seen else None,
            received=self._received,
            answer=self._answer if state >= READING_BODY and seen else None,
        )

    def _fail(self, kind: str, detail: str) -> None:
        done = self._done
        if done is not None and not done.done():
            done.set_exception(self._failure(kind, detail))
        self.close()

    def close(self) -> None:
        if self.state != CLOSED:
            self._enter(CLOSED)
            if self.transport is not None:
                self.transport.close()

    def park(self) -> None:
        """Back to the pool after a complete answer."""
        self._enter(IDLE)

    async def exchange(self, request: bytes, deadline: float, timeout_s: float) -> Answer:
        """Write ``request``, return the answer; ``Failure`` otherwise (at
        ``deadline``, the loop's clock: ``Timeout``, the connection closed).

        The deadline is a timer of the exchange's own, not ``asyncio.timeout``: the
        same cut for a fraction of the cost (a context manager and a task's cancel
        machinery per send, ~5 us of the process's CPU, measured on uvloop)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Answer] = loop.create_future()
        self._answer = Answer()
        self._done, self._drained, self._timeout_s = done, None, timeout_s
        self.written = False
        self._received = self._section_bytes = self._head_size = 0
        self._enter(WRITING)
        timer = loop.call_at(deadline, self._expire)
        try:
            self.transport.write(request)
            if self._drained is not None:
                await self._drained  # the kernel took the rest of the request
            self.written = True
            if self.state == WRITING:
                self._enter(AWAITING_HEAD)
            return await done
        except Failure:
            if done.done() and not done.cancelled():
                done.exception()  # the write's failure is the one raised
            raise
        except BaseException:
            self.close()  # a cancel: the answer is abandoned with the connection
            done.cancel()
            raise
        finally:
            timer.cancel()

    def _expire(self) -> None:
        """The exchange's deadline: whatever it awaits fails with a ``Timeout``."""
        done = self._done
        if done is None or done.done():
            return
        failure = self._failure("Timeout", f"no answer in {self._timeout_s:.3g}s")
        self.close()
        if self._drained is not None and not self._drained.done():
            self._drained.set_exception(failure)
        if not done.done():  # (closing may have settled it: connection_lost)
            done.set_exception(failure)


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
        self,
        target: Target,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        timeout_s: float,
        send_by: float | None = None,
    ) -> Answer:
        """One POST under one total deadline: the answer, or ``Failure``.

        An answer whose body broke off after the status line is still an answer
        (``body_error`` says what happened); a deadline once the head arrived too.
        ``send_by`` (``time.monotonic()``): from then on no byte of the request is
        written (``Failure`` ``Expired``, checked once the connection is ready, right
        before the write; the connection is closed: it may be mid-handshake state).
        """
        request = _request(target, headers, body)
        deadline = asyncio.get_running_loop().time() + timeout_s
        conn = self._checkout(target.key)
        reused = conn is not None
        if conn is None:
            try:
                async with asyncio.timeout_at(deadline):
                    conn = await self._connect(target)
            except TimeoutError:
                raise Failure("Timeout", f"no answer in {timeout_s:.3g}s") from None
        if send_by is not None and time.monotonic() >= send_by:
            conn.close()
            raise Failure("Expired", "its send-by time came before the first byte: not sent")
        try:
            answer = await conn.exchange(request, deadline, timeout_s)
        except Failure as failure:
            if failure.kind == "Timeout" and failure.answer is not None:
                failure.answer.body_error = "body unreadable: TimeoutError"
                return failure.answer  # the head arrived: its status decides
            if reused and failure.kind == "Disconnected" and failure.status is None:
                self._learn(target.key, time.monotonic() - conn.idle_since)
            raise
        if conn.state == DONE:
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
            if conn.state == CLOSED:
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
        conn.park()
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
