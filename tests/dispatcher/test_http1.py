"""The webhook channel's HTTP/1.1 client against real servers on loopback.

A raw asyncio TCP server answers each request with scripted bytes (framed or
not), so every way an answer can be odd is reachable: chunked and
to-the-close bodies, a connection closed mid-head or mid-body, heads too large,
silence, garbage. The client must return an answer or raise ``Failure`` (never
anything else), keep reusing connections after answers that allow it, and say
exactly when a request was handed over with no status line back. TLS runs
against a server whose certificate the test's own CA signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import ipaddress
import socket
import ssl
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest
import trustme
from hypothesis import example, given, settings
from hypothesis import strategies as st

from spark_outbox.core.outside import EXCERPT_BYTES
from spark_outbox.dispatch.channels import Sent
from spark_outbox.dispatch.channels.http1 import (
    _NEXT,
    LEARNED_FLOOR_S,
    MAX_HEAD_BYTES,
    Answer,
    Client,
    Failure,
    State,
    _reuse_limit,
)
from spark_outbox.dispatch.channels.webhook import classify, failed

LOOPBACK = [ipaddress.ip_network("127.0.0.0/8")]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
# One scripted answer: bytes to write, then whether to close the connection.
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


def answer(data: bytes, close: bool = False) -> Script:
    async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return close

    return run


class Server:
    """Answers the n-th request with ``scripts[n]`` (the last one repeats), or, for a
    request whose ``webhook-id`` is in ``keyed``, with that script (order-proof when a
    client may give up before the server has read its request)."""

    def __init__(self, scripts: list[Script], keyed: dict[bytes, Script] | None = None) -> None:
        self.scripts = scripts
        self.keyed = keyed or {}
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length, key = 0, b""
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                    if line.lower().startswith(b"webhook-id:"):
                        key = line.split(b":")[1].strip()
                self.requests.append(head + await reader.readexactly(length))
                script = (
                    self.keyed.get(key)
                    or self.scripts[min(len(self.requests), len(self.scripts)) - 1]
                )
                if await script(reader, writer):
                    break
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/hook?x=1"


@contextlib.asynccontextmanager
async def serving(
    scripts: list[Script],
    tls: ssl.SSLContext | None = None,
    keyed: dict[bytes, Script] | None = None,
) -> AsyncIterator[Server]:
    server = Server(scripts, keyed)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0, ssl=tls)
    server.port = listener.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        listener.close()


async def post(
    client: Client, server: Server, timeout_s: float = 2.0, scheme: str = "http", key: str = "k1"
) -> Answer:
    return await client.post(
        client.target(server.url(scheme)), [("webhook-id", key)], b'{"n":1}', timeout_s
    )


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coro)


def test_the_request_is_what_a_receiver_expects_and_connections_are_reused() -> None:
    async def main() -> None:
        async with serving([answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            for _ in range(3):
                got = await post(client, server)
                assert (got.status, got.reason, bytes(got.body)) == (200, "OK", b"ok")
            await client.close()
        assert server.connections == 1
        head, _, body = server.requests[0].partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        assert lines[0] == b"POST /hook?x=1 HTTP/1.1"
        assert f"Host: 127.0.0.1:{server.port}".encode() in lines
        assert b"Content-Length: 7" in lines and b"webhook-id: k1" in lines
        assert body == b'{"n":1}'

    run(main())


def test_a_chunked_body_is_read_and_the_connection_kept() -> None:
    chunked = (
        b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nRetry-After: 3\r\n\r\n"
        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    )

    async def main() -> None:
        async with serving([answer(chunked), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            got = await post(client, server)
            assert (got.status, bytes(got.body), got.header("retry-after")) == (
                500,
                b"hello world",
                "3",
            )
            assert (await post(client, server)).status == 200
            await client.close()
        assert server.connections == 1

    run(main())


def test_after_a_broken_answer_the_next_send_gets_a_fresh_connection() -> None:
    async def main() -> None:
        async with serving([answer(b"SPAM\x00\xff\r\n\r\n"), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as broken:
                await post(client, server)
            assert broken.value.kind == "BadResponse"
            assert (await post(client, server)).status == 200
            await client.close()
        assert server.connections == 2

    run(main())


def test_a_connection_closed_mid_body_keeps_the_status_and_says_the_body_broke() -> None:
    cut = b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\npartial"

    async def main() -> None:
        async with serving([answer(cut, close=True), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            got = await post(client, server)
            assert got.status == 201 and bytes(got.body) == b"partial"
            assert got.body_error is not None and "mid-body" in got.body_error
            assert (await post(client, server)).status == 200
            await client.close()

    run(main())


def test_a_connection_closed_before_any_answer_was_handed_over() -> None:
    async def main() -> None:
        async with serving([answer(b"", close=True)]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as lost:
                await post(client, server)
            assert (lost.value.kind, lost.value.handed_over) == ("Disconnected", True)
        async with serving([answer(b"HTTP/1.1 200 OK\r\nX-A: b", close=True)]) as server:
            with pytest.raises(Failure) as cut:
                await post(client, server)
            # A status line came back: the receiver answered, it is not "uncertain".
            assert (cut.value.kind, cut.value.handed_over) == ("Disconnected", False)
            await client.close()

    run(main())


class IdleDropper:
    """Answers each request with ``answer(head)``, but drops, unanswered, any request
    that arrives on a connection idle ``idle_s`` or more: a receiver whose idle close
    races the request (the keep-alive race, made certain)."""

    def __init__(self, idle_s: float, answer: Callable[[bytes], bytes] = lambda _: OK) -> None:
        self.idle_s = idle_s
        self.answer = answer
        self.dropped = 0
        self.connections = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered_at: float | None = None
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [
                    int(v.split(b":")[1])
                    for v in head.split(b"\r\n")
                    if v.lower().startswith(b"content-length:")
                ]
                await reader.readexactly(length[0] if length else 0)
                if answered_at is not None and time.monotonic() - answered_at >= self.idle_s:
                    self.dropped += 1
                    break
                writer.write(self.answer(head))
                await writer.drain()
                answered_at = time.monotonic()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


def test_a_connection_idle_past_the_reuse_limit_is_replaced_not_reused() -> None:
    """The keep-alive race, made certain: this receiver drops, unanswered, any request
    that arrives on a connection idle 50 ms or more (as one whose idle timeout fires as
    the request comes in). A client that reuses it loses the send, handed over (an
    uncertain outcome where the endpoint cannot deduplicate); under its idle limit
    (IDLE_REUSE_S, 1.5 s by default) the client opens a fresh connection instead."""
    server = IdleDropper(0.05)

    async def main() -> None:
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/hook"
        try:
            for limit_s in (0.03, 10.0):
                client = Client(4, LOOPBACK, None, idle_reuse_s=limit_s)
                target = client.target(url)
                assert (await client.post(target, [], b"{}", 2.0)).status == 200
                await asyncio.sleep(0.08)
                if limit_s < 0.05:
                    assert (await client.post(target, [], b"{}", 2.0)).status == 200
                else:
                    with pytest.raises(Failure) as lost:
                        await client.post(target, [], b"{}", 2.0)
                    assert (lost.value.kind, lost.value.handed_over) == ("Disconnected", True)
                await client.close()
        finally:
            listener.close()
        assert server.dropped == 1  # only the client that reused the idle connection

    run(main())


def test_a_receivers_announced_keep_alive_timeout_shortens_the_reuse_limit() -> None:
    """A receiver that says ``Keep-Alive: timeout=1`` is reused only within half a
    second. This one drops, unanswered, any request on a connection idle 0.6 s or
    more (its close racing the request); the client waits 0.7 s between sends. Under
    the default limit alone (1.5 s) the second send would be lost, handed over; the
    header makes the client open a fresh connection. ``timeout=0``: never pooled."""

    def announce(head: bytes) -> bytes:
        timeout = b"0" if b"/zero" in head.split(b"\r\n")[0] else b"1"
        return (
            b"HTTP/1.1 200 OK\r\nKeep-Alive: max=100, timeout=" + timeout
            + b"\r\nContent-Length: 2\r\n\r\nok"
        )  # fmt: skip

    server = IdleDropper(0.6, announce)

    async def main() -> None:
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
        try:
            client = Client(4, LOOPBACK, None)  # the default limit, 1.5 s
            target = client.target(f"{base}/hook")
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            assert server.connections == 1  # reused at once: within the limit
            await asyncio.sleep(0.7)
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            assert server.connections == 2  # past half the announced timeout: replaced
            zero = client.target(f"{base}/zero")
            for _ in range(3):
                assert (await client.post(zero, [], b"{}", 2.0)).status == 200
            # The first reuses the pooled connection (same host and port); each answer
            # with timeout=0 closes its connection, so the next two open fresh ones.
            assert server.connections == 4
            await client.close()
        finally:
            listener.close()
        assert server.dropped == 0

    run(main())


def test_a_receiver_that_closes_idle_connections_early_without_saying_so_is_learned() -> None:
    """No ``Keep-Alive`` header, and an idle close (0.3 s) under the client's limit
    (1.5 s). The first reuse after 0.4 s idle is lost, handed over, as before; it
    teaches the client to reuse this receiver's connections only within half that
    idle time. The next send after 0.4 s idle opens a fresh connection and is
    answered; one after 0.05 s still reuses. Without the learning the third send
    is lost too (checked)."""
    server = IdleDropper(0.3)

    async def main() -> None:
        listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/hook"
        try:
            client = Client(4, LOOPBACK, None)  # the default limit, 1.5 s
            target = client.target(url)
            assert client.idle_limit(target.key) == 1.5
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            await asyncio.sleep(0.4)
            with pytest.raises(Failure) as lost:
                await client.post(target, [], b"{}", 2.0)
            assert (lost.value.kind, lost.value.handed_over) == ("Disconnected", True)
            assert 0.2 <= client.idle_limit(target.key) < 0.3  # half of ~0.4 s
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            await asyncio.sleep(0.4)
            assert (await client.post(target, [], b"{}", 2.0)).status == 200  # replaced
            connections = server.connections
            await asyncio.sleep(0.05)
            assert (await client.post(target, [], b"{}", 2.0)).status == 200
            assert server.connections == connections  # reused: within the learned limit
            await client.close()
        finally:
            listener.close()
        assert server.dropped == 1

    run(main())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=1e6), max_size=8), st.booleans())
def test_a_learned_idle_limit_stays_between_the_floor_and_the_clients_own(
    idle_times: list[float], expired: bool
) -> None:
    """Whatever idle times lost reuses report, the limit is never under
    LEARNED_FLOOR_S nor over the client's own, only shrinks while it lasts, and is
    forgotten once LEARNED_TTL_S has passed."""
    client = Client(4, LOOPBACK, None, idle_reuse_s=1.5)
    key = (False, "receiver.example", 80)
    previous = client.idle_limit(key)
    for idle_s in idle_times:
        client._learn(key, idle_s)
        limit = client.idle_limit(key)
        assert LEARNED_FLOOR_S <= limit <= 1.5
        assert limit <= previous
        previous = limit
    if expired and idle_times:
        limit_s, _ = client._learned[key]
        client._learned[key] = (limit_s, time.monotonic() - 1)
        assert client.idle_limit(key) == 1.5


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_any_keep_alive_header_gives_a_reuse_limit_within_the_clients(value: str) -> None:
    """A hostile header never raises and never extends the client's own limit."""
    answer = Answer()
    answer.headers = [("keep-alive", value), ("KEEP-ALIVE", "timeout=9999999")]
    limit = _reuse_limit(answer, 1.5)
    assert 0.0 <= limit <= 1.5
    answer.headers = [("Keep-Alive", "max=5, timeout=2")]
    assert _reuse_limit(answer, 1.5) == 1.0


def test_a_body_to_the_close_is_read() -> None:
    async def main() -> None:
        async with serving([answer(b"HTTP/1.1 404 NF\r\n\r\nnot here", close=True)]) as server:
            client = Client(4, LOOPBACK, None)
            got = await post(client, server)
            assert (got.status, bytes(got.body), got.body_error) == (404, b"not here", None)
            await client.close()

    run(main())


def test_an_oversized_head_is_refused() -> None:
    huge = b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n"

    async def main() -> None:
        async with serving([answer(huge), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as refused:
                await post(client, server)
            assert refused.value.kind == "BadResponse" and "head over" in refused.value.detail
            assert (await post(client, server)).status == 200
            await client.close()

    run(main())


def test_a_long_body_is_cut_at_the_excerpt_and_its_connection_not_reused() -> None:
    long = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"z" * 100000

    async def main() -> None:
        async with serving([answer(long), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            got = await post(client, server)
            assert got.status == 200 and len(got.body) == EXCERPT_BYTES
            assert (await post(client, server)).status == 200
            await client.close()
        assert server.connections == 2

    run(main())


def test_silence_is_a_timeout_after_the_request_was_handed_over() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await reader.read()
        return True

    async def main() -> None:
        async with serving([silent]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as late:
                await post(client, server, timeout_s=0.2)
            assert (late.value.kind, late.value.handed_over) == ("Timeout", True)
            await client.close()

    run(main())


def test_a_deadline_on_a_reused_connection_cuts_it_and_the_next_send_gets_a_fresh_one() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await reader.read()
        return True

    async def main() -> None:
        async with serving([answer(OK), silent, answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            assert (await post(client, server)).status == 200
            t0 = time.monotonic()
            with pytest.raises(Failure) as late:
                await post(client, server, timeout_s=0.2)  # on the first send's connection
            assert 0.15 < time.monotonic() - t0 < 1.0
            assert (late.value.kind, late.value.handed_over) == ("Timeout", True)
            assert server.connections == 1
            assert (await post(client, server)).status == 200
            assert server.connections == 2  # the cut connection was not reused
            await client.close()

    run(main())


def test_a_deadline_while_the_request_is_still_being_written_is_not_handed_over() -> None:
    """A receiver that reads nothing: the kernel's buffers fill, the write waits, and
    the deadline ends it with the request not handed over (and no error of the
    deadline's callback reaches the loop's exception handler)."""
    held: list[asyncio.StreamWriter] = []

    async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await asyncio.sleep(5)

    async def main() -> None:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        listener = await asyncio.start_server(never_reads, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        client = Client(4, LOOPBACK, None)
        target = client.target(f"http://127.0.0.1:{port}/hook")
        with pytest.raises(Failure) as late:
            await client.post(target, [("webhook-id", "k")], b"x" * 64_000_000, 0.3)
        assert (late.value.kind, late.value.handed_over) == ("Timeout", False)
        await client.close()
        listener.close()
        for writer in held:
            writer.close()
        await asyncio.sleep(0.05)
        assert errors == []

    run(main())


def test_a_drip_after_the_head_keeps_the_status_when_the_deadline_ends_it() -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")
        for _ in range(50):
            writer.write(b"x")
            await writer.drain()
            await asyncio.sleep(0.05)
        return True

    async def main() -> None:
        async with serving([drip]) as server:
            client = Client(4, LOOPBACK, None)
            got = await post(client, server, timeout_s=0.3)
            assert got.status == 200 and got.body_error == "body unreadable: TimeoutError"
            await client.close()

    run(main())


def test_refused_connections_and_the_ssrf_guard_are_failures_before_any_send() -> None:
    async def main() -> None:
        client = Client(4, LOOPBACK, None)
        with pytest.raises(Failure) as refused:
            await client.post(client.target("http://127.0.0.1:9/x"), [], b"", 2.0)
        assert (refused.value.kind, refused.value.handed_over) == ("ConnectFailed", False)
        guarded = Client(4, [], None)
        with pytest.raises(Failure) as ssrf:
            await guarded.post(guarded.target("http://127.0.0.1:9/x"), [], b"", 2.0)
        assert ssrf.value.kind == "SsrfRefused" and "loopback" in ssrf.value.detail
        with pytest.raises(Failure) as bad:
            client.target("ftp://example.com/x")
        assert bad.value.kind == "InvalidUrl"

    run(main())


def test_https_to_a_server_we_verify_and_refused_to_one_we_do_not() -> None:
    authority = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_ctx)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)

    async def main() -> None:
        async with serving([answer(OK)], tls=server_ctx) as server:
            client = Client(4, LOOPBACK, trusting)
            for _ in range(2):
                assert (await post(client, server, scheme="https")).status == 200
            await client.close()
            assert server.connections == 1
            stranger = Client(4, LOOPBACK, ssl.create_default_context())
            with pytest.raises(Failure) as untrusted:
                await post(stranger, server, scheme="https")
            assert untrusted.value.kind == "ConnectFailed" and "TLS" in untrusted.value.detail

    run(main())


@settings(max_examples=40, deadline=None)
@given(raw=st.binary(max_size=400), close=st.booleans())
def test_any_bytes_end_as_an_answer_or_a_failure_and_the_client_goes_on(
    raw: bytes, close: bool
) -> None:
    async def main() -> None:
        async with serving([answer(OK)], keyed={b"odd": answer(raw, close=close)}) as server:
            client = Client(4, LOOPBACK, None)
            try:
                got = await post(client, server, timeout_s=0.3, key="odd")
                assert 0 <= got.status <= 999 and len(got.body) <= EXCERPT_BYTES
            except Failure as failure:
                assert failure.kind in {"BadResponse", "Disconnected", "Timeout"}
            assert (await post(client, server)).status == 200
            await client.close()

    run(main())


def test_interim_answers_are_skipped_and_the_final_answer_is_read() -> None:
    """100 Continue and 103 Early Hints come before the final answer (together, or
    one by one as separate reads); the final one is returned, without the interim
    answers' headers, and its connection is reused."""
    interim = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    )

    async def one_by_one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        for piece in (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 103 Hints\r\n\r\n", OK):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        return False

    async def main() -> None:
        async with serving([answer(interim + OK), one_by_one, answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            for _ in range(3):
                got = await post(client, server)
                assert (got.status, got.reason, bytes(got.body)) == (200, "OK", b"ok")
                assert got.header("Link") is None
            await client.close()
        assert server.connections == 1

    run(main())


def test_an_endless_run_of_interim_answers_is_refused_as_an_oversized_head() -> None:
    endless = b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_HEAD_BYTES // 10)

    async def main() -> None:
        async with serving([answer(endless), answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as refused:
                await post(client, server)
            assert refused.value.kind == "BadResponse" and "head over" in refused.value.detail
            assert (await post(client, server)).status == 200
            await client.close()

    run(main())


def test_a_head_broken_after_its_status_line_leaves_the_outcome_unknown() -> None:
    """The whole request was written and the receiver answered a status line, then
    a header line that breaks HTTP: the failure says so (written, status 200), and
    that nothing readable came back (``outcome_unknown``; ``handed_over`` keeps its
    meaning: no status line). Garbage before any status line: the same unknown."""
    broken = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nthis is no header\r\n\r\nok"

    async def main() -> None:
        async with serving([answer(broken), answer(b"\x00garbage\r\n\r\n")]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as bad:
                await post(client, server)
            failure = bad.value
            assert (failure.kind, failure.written, failure.status) == ("BadResponse", True, 200)
            assert failure.received == len(broken)
            assert failure.outcome_unknown and not failure.handed_over
            with pytest.raises(Failure) as garbage:
                await post(client, server)
            assert garbage.value.status is None and garbage.value.outcome_unknown
            await client.close()

    run(main())


HALF_HEAD = b"HTTP/1.1 503 Busy\r\nX-A: b\r\n"


def test_a_timeout_carries_how_far_the_exchange_got() -> None:
    async def head_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(HALF_HEAD)
        await writer.drain()
        await reader.read()
        return True

    async def main() -> None:
        async with serving([head_then_silence]) as server:
            client = Client(4, LOOPBACK, None)
            with pytest.raises(Failure) as late:
                await post(client, server, timeout_s=0.2)
            failure = late.value
            assert (failure.kind, failure.written, failure.status) == ("Timeout", True, 503)
            assert failure.received == len(HALF_HEAD) and failure.answer is None
            assert not failure.handed_over and not failure.outcome_unknown
            await client.close()

    run(main())


TRAILER_LINE = b"X-Trailer: " + b"t" * 4096 + b"\r\n"


def test_an_endless_trailer_section_is_refused_and_memory_does_not_grow_with_it() -> None:
    """A chunked 200 whose body ends in a trailer section that goes on and on (up
    to 64 MiB offered): the trailers count against MAX_HEAD_BYTES with the head,
    the client refuses the answer (``BadResponse``, the reason names the trailers),
    hangs up, and its memory never holds more than a few reads of them."""
    offered = 64 * 1024 * 1024
    sent = [0]

    async def trailers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n")
        with contextlib.suppress(OSError):
            while sent[0] < offered:
                writer.write(TRAILER_LINE * 16)
                await writer.drain()
                sent[0] += len(TRAILER_LINE) * 16
            writer.write(b"\r\n")
            await writer.drain()
        return True

    async def main() -> None:
        async with serving([trailers, answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            tracemalloc.start()
            try:
                with pytest.raises(Failure) as refused:
                    await post(client, server, timeout_s=20.0)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            failure = refused.value
            assert failure.kind == "BadResponse" and "trailers over" in failure.detail
            assert (failure.written, failure.status) == (True, 200) and failure.outcome_unknown
            assert peak < 4 * 1024 * 1024, peak
            await asyncio.sleep(0.2)
            assert sent[0] < offered // 4, sent[0]  # the client hung up long before the end
            assert (await post(client, server)).status == 200
            await client.close()

    run(main())


def test_small_trailers_are_read_and_the_connection_kept() -> None:
    """Trailers within the limit, and a body whose chunk size lines end reads (each
    chunk's data comes in the next read): answered as before, the connection reused."""

    async def chunks(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n")
        for piece in (b"3\r\n", b"abc\r\n4\r\n", b"defg\r\n0\r\n", b"X-Sum: 7\r\n\r\n"):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.01)
        return False

    async def main() -> None:
        async with serving([chunks]) as server:
            client = Client(4, LOOPBACK, None)
            for _ in range(2):
                got = await post(client, server)
                assert (got.status, bytes(got.body), got.header("X-Sum")) == (202, b"abcdefg", "7")
            await client.close()
        assert server.connections == 1

    run(main())


FILLER_SIZES = st.sampled_from([0, 5, 3000, 20_000, 3_000_000])


@dataclasses.dataclass(frozen=True)
class Generated:
    """A generated answer, small to show: interim heads, a status, headers (odd
    bytes, and one of any size), a framing (length, chunks with trailers of any size,
    to the close) over a body of any size, the whole cut anywhere or not."""

    interims: int
    status: int
    reason: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    header_fill: int
    body_len: int
    framing: str
    trailer_fill: int
    cut_at: int | None  # a fraction in 1/1000 of the whole

    def raw(self) -> bytes:
        parts = [b"HTTP/1.1 100 Continue\r\n\r\n"] * self.interims
        parts.append(b"HTTP/1.1 %d %s\r\n" % (self.status, self.reason))
        parts += [name + b": " + value + b"\r\n" for name, value in self.headers]
        if self.header_fill:
            parts.append(b"X-Big: " + b"h" * self.header_fill + b"\r\n")
        body = b"b" * self.body_len
        if self.framing == "length":
            parts.append(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        elif self.framing == "chunked":
            parts.append(b"Transfer-Encoding: chunked\r\n\r\n")
            if body:
                parts.append(b"%x\r\n" % len(body) + body + b"\r\n")
            parts.append(b"0\r\n")
            if self.trailer_fill:
                parts.append(b"X-T: " + b"t" * self.trailer_fill + b"\r\n")
            parts.append(b"\r\n")
        else:
            parts.append(b"Connection: close\r\n\r\n" + body)
        raw = b"".join(parts)
        return raw if self.cut_at is None else raw[: len(raw) * self.cut_at // 1000]

    @property
    def closes(self) -> bool:
        return self.cut_at is not None or self.framing == "close"


generated = st.builds(
    Generated,
    interims=st.integers(0, 2),
    status=st.sampled_from([200, 201, 204, 302, 404, 410, 429, 500, 503]),
    reason=st.binary(max_size=12),
    headers=st.lists(
        st.tuples(
            st.sampled_from([b"X-A", b"Retry-After", b"Keep-Alive", b"Set-Cookie"]),
            st.binary(max_size=30),
        ),
        max_size=3,
    ).map(tuple),
    header_fill=FILLER_SIZES,
    body_len=FILLER_SIZES,
    framing=st.sampled_from(["length", "chunked", "close"]),
    trailer_fill=FILLER_SIZES,
    cut_at=st.none() | st.integers(0, 999),
)


class ThreadedReceiver:
    """A blocking receiver in threads of its own (no asyncio write buffer whose
    copies would count as the client's memory): a request whose ``webhook-id`` is
    ``odd`` gets ``chunks`` (then a close if ``close``), any other one ``OK``."""

    def __init__(self, chunks: list[memoryview], close: bool) -> None:
        self.chunks, self.close = chunks, close
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}/hook"

    def __enter__(self) -> ThreadedReceiver:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self._sock.close()

    def _accept(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self._sock.accept()
                threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    more = conn.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, data = data.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                if b"webhook-id: odd" not in head:
                    conn.sendall(OK)
                    continue
                for chunk in self.chunks:
                    conn.sendall(chunk)
                    time.sleep(0)
                if self.close:
                    return


@settings(max_examples=60, deadline=None)
@given(drawn=generated, pieces=st.integers(1, 4))
@example(drawn=Generated(0, 200, b"OK", (), 0, 2, "chunked", 3_000_000, None), pieces=2)
@example(drawn=Generated(2, 204, b"", (), 0, 0, "length", 0, None), pieces=1)
def test_any_generated_answer_ends_as_a_recorded_outcome_in_bounded_memory(
    drawn: Generated, pieces: int
) -> None:
    """Whatever a receiver on loopback answers, in however many writes (big heads,
    bodies and trailers up to 3 MB included): an Answer or a Failure, each
    classified as a webhook outcome; the client's memory stays within a few socket
    reads whatever the answer's size; and the next send is answered."""
    raw = drawn.raw()
    step = max(1, len(raw) // pieces)
    # Sliced before the count starts: the receiver's own bytes are not the client's.
    chunks = [memoryview(raw)[at : at + step] for at in range(0, len(raw), step)]

    async def main() -> None:
        with ThreadedReceiver(chunks, drawn.closes) as server:
            client = Client(4, LOOPBACK, None)
            target = client.target(server.url)
            tracemalloc.start()
            try:
                got = await client.post(target, [("webhook-id", "odd")], b"{}", 0.5)
                sent = Sent(classify(got.status, None)[0])
                assert got.status >= 200 and len(got.body) <= EXCERPT_BYTES
            except Failure as failure:
                sent = failed(failure)
                assert failure.kind in {"BadResponse", "Disconnected", "Timeout"}
            finally:
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
            assert sent.outcome in {"delivered", "retry", "dead", "gone"}
            assert peak < 2 * 1024 * 1024, peak
            assert (await client.post(target, [("webhook-id", "ok")], b"{}", 2.0)).status == 200
            await client.close()

    run(main())


def test_every_state_can_close_and_is_reached_from_idle() -> None:
    """The transition table is whole: from IDLE every state is reachable, every
    state may close, only CLOSED is final, and a complete exchange leads back to IDLE."""
    reached, todo = {State.IDLE}, [State.IDLE]
    while todo:
        for nxt in (*_NEXT[todo.pop()], State.CLOSED):
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert reached == set(State)
    assert [s for s in State if not _NEXT[s]] == [State.CLOSED]
    assert State.IDLE in _NEXT[State.DONE]


def test_a_cancelled_send_closes_its_connection_and_leaves_nothing_unretrieved() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        await reader.read()
        return True

    async def main() -> None:
        errors: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: errors.append(ctx))
        async with serving([answer(OK), silent, answer(OK)]) as server:
            client = Client(4, LOOPBACK, None)
            assert (await post(client, server)).status == 200
            sending = asyncio.create_task(post(client, server))
            await asyncio.sleep(0.1)
            sending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await sending
            assert (await post(client, server)).status == 200
            assert server.connections == 2  # the cancelled send's connection was closed
            await client.close()
        del sending
        gc.collect()
        await asyncio.sleep(0.05)
        assert errors == []

    run(main())
