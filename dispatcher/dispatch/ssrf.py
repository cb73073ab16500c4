"""The SSRF guard: refuse to connect to internal addresses unless allow-listed.

The webhook client (dispatcher/dispatch/channels/http1.py) runs the check on every
resolved address right before its socket connects to it, so it judges the
address actually connected to: a DNS answer that changes between a check and
the connect (rebinding) cannot slip past, and IP-literal URLs are covered too.

An IPv6 address that carries an IPv4 address is judged by the IPv4 address it
carries, so no wrapping smuggles an internal address past the guard. Internal
inside is always refused; public inside passes only where the form routes to
that host: IPv4-mapped (``::ffff:0:0/96``), NAT64's well-known prefix
(``64:ff9b::/96``, how DNS64 networks reach public IPv4 hosts) and 6to4
(``2002::/16``). IPv4-compatible (``::/96``, deprecated, never routed), Teredo
(``2001::/32``, a NAT-traversal tunnel) and NAT64's local-use prefix
(``64:ff9b:1::/48``) are refused whatever they carry.

An allow-listed IPv4 network admits its embedded forms too (every IPv4 address a
form carries must be inside it); the local-use prefix is admitted only by
allow-listing the IPv6 network itself, since where the IPv4 address sits in it
depends on the site's translator (docs/dispatcher.md has the table).
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import socket
from collections.abc import Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# Beyond what ``ipaddress`` flags: CGNAT (shared address space) is not "private" there.
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_COMPATIBLE = ipaddress.ip_network("::/96")
# Forms refused even when the IPv4 address inside is public (see the table above).
_NEVER_PUBLIC = {"IPv4-compatible": "deprecated, never routed", "Teredo": "a NAT-traversal tunnel"}


class SsrfRefused(OSError):
    """Raised instead of connecting (the webhook client turns it into a dead attempt)."""

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(f"refused by SSRF guard: {address} is {reason}")
        self.address = address
        self.reason = reason


def embedded_ipv4(
    address: ipaddress.IPv6Address,
) -> tuple[str, tuple[ipaddress.IPv4Address, ...]] | None:
    """The form's name and the IPv4 addresses an IPv6 address carries (None: none)."""
    if address.ipv4_mapped is not None:
        return "IPv4-mapped", (address.ipv4_mapped,)
    if address in _NAT64:
        return "NAT64", (ipaddress.IPv4Address(int(address) & 0xFFFFFFFF),)
    if address.sixtofour is not None:
        return "6to4", (address.sixtofour,)
    if address.teredo is not None:
        return "Teredo", address.teredo
    # :: and ::1 are the unspecified and loopback addresses, not IPv4-compatible ones.
    if address in _COMPATIBLE and int(address) > 1:
        return "IPv4-compatible", (ipaddress.IPv4Address(int(address)),)
    return None


def forbidden_reason(address: Address) -> str | None:
    """Why ``address`` is internal (None when it is a public unicast address)."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in _NAT64_LOCAL:
            return "in the NAT64 local-use prefix (a site's own translator)"
        embedded = embedded_ipv4(address)
        if embedded is not None:
            form, inner = embedded
            for ipv4 in inner:
                reason = forbidden_reason(ipv4)
                if reason is not None:
                    return f"{form} {reason}"
            return f"{form} ({_NEVER_PUBLIC[form]})" if form in _NEVER_PUBLIC else None
    # fec0::/10: site-local, deprecated (RFC 3879) yet still routed inside some
    # networks; ``ipaddress`` counts it neither private nor reserved.
    site_local = isinstance(address, ipaddress.IPv6Address) and address.is_site_local
    checks = (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local (cloud metadata lives here)", address.is_link_local),
        ("CGNAT shared address space", address in _CGNAT),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("site-local (fec0::/10, deprecated)", site_local),
    )
    for reason, hit in checks:
        if hit:
            return reason
    return None


def _allowed(ip: Address, allow: Sequence[Network]) -> bool:
    if any(ip in net for net in allow):
        return True
    embedded = embedded_ipv4(ip) if isinstance(ip, ipaddress.IPv6Address) else None
    return embedded is not None and all(any(v4 in net for net in allow) for v4 in embedded[1])


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
