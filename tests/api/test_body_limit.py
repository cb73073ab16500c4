"""Every request body is bounded (``api.bodylimit``): the API once read a JSON body
whole, whatever its size, so one client could hold its memory. Driven over a real
socket against ``outbox api serve``: a declared length past the bound is refused
before a byte of the body is read, a chunked body at the first chunk past it, and a
body within it reaches its route."""

from __future__ import annotations

import socket

import httpx

from spark_outbox.api.bodylimit import MAX_BODY_BYTES
from tests.api.conftest import Served, Tokens

ROUTE = "/v1/effects/bulk-requeue"


def _raw(served: Served, head: str, body_chunks: list[bytes]) -> bytes:
    """Send ``head`` and the chunks on one connection, then read the answer (until
    the server closes, or its refusal is whole). Nothing past what the server reads
    is sent: data left unread when it closes would reset the connection, and a reset
    discards an answer not yet read."""
    host, port = served.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head.encode())
        for chunk in body_chunks:
            sock.sendall(chunk)
        answer = b""
        while (data := sock.recv(65536)) and b"KiB" not in answer + data:
            answer += data
        return answer + data


def test_a_declared_length_past_the_bound_is_refused_before_the_body_is_sent(
    served: Served, api_tokens: Tokens
) -> None:
    (auth,) = api_tokens.auth("operator").items()
    head = (
        f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\n{auth[0]}: {auth[1]}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {10 * MAX_BODY_BYTES}\r\n\r\n"
    )
    answer = _raw(served, head, [])  # not a byte of the ten mebibytes
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    assert b"larger than 1024 KiB" in answer


def test_a_chunked_body_is_refused_at_the_chunk_past_the_bound(
    served: Served, api_tokens: Tokens
) -> None:
    (auth,) = api_tokens.auth("operator").items()
    head = (
        f"POST {ROUTE} HTTP/1.1\r\nHost: x\r\n{auth[0]}: {auth[1]}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    piece = b" " * 65536
    # Up to the first chunk past the bound (without the last chunk's terminator).
    chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * (MAX_BODY_BYTES // len(piece) + 1)
    answer = _raw(served, head, chunks)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:300]
    # The API still answers the next caller.
    assert httpx.get(f"{served.url}/readyz", timeout=10).status_code == 200


def test_a_body_within_the_bound_reaches_its_route(served: Served, api_tokens: Tokens) -> None:
    body = '{"reason": "' + "r" * (MAX_BODY_BYTES - 100) + '"}'
    answer = httpx.post(
        f"{served.url}{ROUTE}",
        content=body,
        headers=api_tokens.auth("operator") | {"Content-Type": "application/json"},
        timeout=30,
    )
    assert answer.status_code == 422, answer.text  # the route's own check, not the bound
    assert "reason" in answer.text
