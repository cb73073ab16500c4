"""Pure policies: the SSRF address rules, the retry schedule, Retry-After, signing."""

from __future__ import annotations

import datetime as dt
import ipaddress

import pytest
from standardwebhooks import Webhook

from dispatcher import retry, signing, ssrf
from dispatcher.breaker import THRESHOLD, Breakers
from dispatcher.endpoints import generate_signing_secret, secret_bytes


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("172.16.5.4", "private"),
        ("169.254.169.254", "link-local"),
        ("fe80::1", "link-local"),
        ("100.64.0.1", "CGNAT"),
        ("224.0.0.1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("::ffff:127.0.0.1", "IPv4-mapped loopback"),
        ("::ffff:169.254.169.254", "IPv4-mapped link-local"),
    ],
)
def test_internal_addresses_are_refused_with_the_reason(address: str, reason: str) -> None:
    with pytest.raises(ssrf.SsrfRefused) as info:
        ssrf.check(address, ())
    assert reason in str(info.value) and "OUTBOX_SSRF_ALLOW_NETWORKS" in str(info.value)


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"])
def test_public_addresses_pass(address: str) -> None:
    ssrf.check(address, ())


def test_an_allow_listed_network_passes_including_its_mapped_form() -> None:
    allow = (ipaddress.ip_network("127.0.0.0/8"),)
    ssrf.check("127.0.0.1", allow)
    ssrf.check("::ffff:127.0.0.1", allow)
    with pytest.raises(ssrf.SsrfRefused):
        ssrf.check("10.0.0.1", allow)


def test_the_schedule_gives_the_next_delay_with_jitter_then_gives_up() -> None:
    schedule = (0, 5, 300)
    delays = [retry.next_delay_s(1, schedule) for _ in range(200)]
    assert all(d is not None and 4.0 <= d <= 6.0 for d in delays)
    assert len(set(delays)) > 1  # jittered
    assert retry.next_delay_s(3, schedule) is None


def test_retry_after_seconds_and_http_date_are_understood_and_capped() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    assert retry.parse_retry_after("120") == 120
    assert retry.parse_retry_after("Thu, 01 Jan 2026 12:01:00 GMT", now) == 60
    assert retry.parse_retry_after("soon") is None
    assert retry.delay_with_retry_after(1, (0, 1), 999999, cap_s=3600) == 3600
    delay = retry.delay_with_retry_after(1, (0, 1), 30, cap_s=3600)
    assert delay == 30


def test_signatures_verify_with_the_standardwebhooks_package() -> None:
    secret = generate_signing_secret()
    body = b'{"a": 1}'
    headers = signing.headers(
        [secret_bytes(secret)], "k" * 64, int(dt.datetime.now().timestamp()), body
    )
    assert Webhook(secret).verify(body, headers) == {"a": 1}
    with pytest.raises(Exception, match=r"(?i)signature"):
        Webhook(secret).verify(b'{"a": 2}', headers)


def test_the_breaker_rests_a_failing_endpoint_and_closes_on_success() -> None:
    breakers = Breakers()
    for _ in range(THRESHOLD - 1):
        breakers.outcome("hook", "retry")
    assert breakers.rest_s("hook") is None  # not yet
    breakers.outcome("hook", "retry")
    first = breakers.rest_s("hook")
    assert first is not None and 0 < first <= 1.0
    breakers.outcome("hook", "retry")
    second = breakers.rest_s("hook")
    assert second is not None and second > first  # the cool-down doubles
    breakers.outcome("hook", "delivered")
    assert breakers.rest_s("hook") is None
    breakers.outcome("hook", "gone")
    assert breakers.rest_s("hook") == float("inf")
    breakers.forget("hook")  # resumed by an operator
    assert breakers.rest_s("hook") is None
    assert breakers.rest_s("other") is None
