"""The SSRF guard: refuse to connect to internal addresses unless allow-listed.

The check runs in the socket factory the HTTP connector calls for every address
it is about to connect to, so it judges the address actually connected to: a
DNS answer that changes between a check and the connect (rebinding) cannot slip
past, and IP-literal URLs are covered too.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import socket
from collections.abc import Sequence
from typing import Any

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Beyond what ``ipaddress`` flags: CGNAT (shared address space) is not "private" there.
_CGNAT = ipaddress.ip_network("100.64.0.0/10")


class SsrfRefused(OSError):
    """Raised instead of connecting; an OSError so the HTTP client surfaces it as a
    connection error carrying this exception (``ClientConnectorError.os_error``)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"refused by SSRF guard: {address} is {reason}")
        self.address = address
        self.reason = reason


def forbidden_reason(address: Address) -> str | None:
    """Why ``address`` is internal (None when it is a public unicast address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        inner = forbidden_reason(address.ipv4_mapped)
        return f"IPv4-mapped {inner}" if inner else None
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local (cloud metadata lives here)", address.is_link_local),
        ("CGNAT shared address space", address in _CGNAT),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
    )
    for reason, hit in checks:
        if hit:
            return reason
    return None


def _allowed(ip: Address, allow: Sequence[Network]) -> bool:
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return any(ip in net or (mapped is not None and mapped in net) for net in allow)


def check(address: str, allow: Sequence[Network]) -> None:
    """Raise ``SsrfRefused`` unless ``address`` is public or inside an allowed network."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if _allowed(ip, allow):
        return
    reason = forbidden_reason(ip)
    if reason is not None:
        raise SsrfRefused(
            str(ip), f"{reason}; allow-list its network in OUTBOX_SSRF_ALLOW_NETWORKS"
        )


def refused_addresses(
    host: str, allow: Sequence[Network], *, timeout_s: float = 2.0
) -> list[tuple[Address, str]]:
    """The addresses ``host`` resolves to now that the guard would refuse, with why.

    For a warning when an endpoint is registered ("trying it locally" with a
    receiver on 127.0.0.1); the guard itself judges every connect. A name that
    does not resolve within ``timeout_s`` gives no answer (an empty list).
    """
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        found = pool.submit(socket.getaddrinfo, host, None, type=socket.SOCK_STREAM)
        infos = found.result(timeout=timeout_s)
    except (OSError, UnicodeError, concurrent.futures.TimeoutError):
        return []
    finally:
        pool.shutdown(wait=False)
    refused: dict[Address, str] = {}
    for *_, sockaddr in infos:
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        reason = None if _allowed(ip, allow) else forbidden_reason(ip)
        if reason is not None:
            refused[ip] = reason
    return list(refused.items())


def socket_factory(allow: Sequence[Network]) -> Any:
    """A socket factory for ``aiohttp.TCPConnector`` that checks before connecting."""

    def make(addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _, sockaddr = addr_info
        check(str(sockaddr[0]), allow)
        return socket.socket(family=family, type=type_, proto=proto)

    return make


def refusal_in(exc: BaseException) -> SsrfRefused | None:
    """Find an ``SsrfRefused`` in an exception's chain (clients wrap it)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, SsrfRefused):
            return seen
        inner = getattr(seen, "os_error", None)
        if isinstance(inner, SsrfRefused):
            return inner
        seen = seen.__cause__ or seen.__context__
    return None
