"""Signed webhook deliveries over a lean HTTP/1.1 client: one keep-alive pool per worker.

The client (``spark_outbox.dispatch.channels.http1``: an asyncio Protocol and httptools'
C parser) replaced aiohttp on the send path: measured here, it costs a fraction
of aiohttp's CPU per POST (bench/RESULTS.md, docs/dispatcher.md "Webhook
client"). Redirects are never followed (a 3xx is a failure). Every connection
passes the SSRF guard on the address it actually connects to.

Whatever the receiver sends back (a broken status line, NULs, invalid UTF-8,
an endless body, a drip, silence, a reset) ends as a ``Sent`` with one of the
error classes below; the outcome table is in docs/dispatcher.md. A failure with
no status line after the whole request was written, or with an answer that broke
HTTP after its status line, is marked ``handed_over``: for an endpoint that
cannot deduplicate it ends 'uncertain' (docs/dispatcher.md, "Uncertain sends").
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import ssl
import time

from spark_outbox.core import outside
from spark_outbox.core.endpoints import Endpoint, secret_bytes
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import signing
from spark_outbox.dispatch.channels import NOT_STARTED, Sent, Start, expired, past_send_by
from spark_outbox.dispatch.channels.http1 import Answer, Client, Failure
from spark_outbox.dispatch.retry import parse_retry_after
from spark_outbox.dispatch.store import Claimed

log = logging.getLogger(__name__)

# Response headers whose values an excerpt keeps: an allow-list, since a deny-list
# cannot know every receiver's own name for a credential (X-Session, X-Access...).
# Kept: what says how the answer was framed and who sent it (content-*, date,
# server, via), when to come back (retry-after, rate-limit counters), where a
# redirect pointed (location: the 3xx reason quotes it anyway), why a 401 came
# (www-authenticate: a challenge, never a credential) and the ids a receiver's
# support asks for (x-request-id and its kin). Every other header is listed by
# name with its value redacted: that it was there can matter, its value may not leak.
_SHOWN = frozenset(
    (
        "age",
        "allow",
        "cache-control",
        "cf-ray",
        "connection",
        "content-encoding",
        "content-language",
        "content-length",
        "content-type",
        "date",
        "etag",
        "expires",
        "keep-alive",
        "last-modified",
        "location",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "request-id",
        "retry-after",
        "server",
        "trace-id",
        "traceparent",
        "transfer-encoding",
        "vary",
        "via",
        "www-authenticate",
        "x-amz-cf-id",
        "x-amz-request-id",
        "x-amzn-requestid",
        "x-correlation-id",
        "x-github-request-id",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-request-id",
        "x-trace-id",
    )
)
_RETRYABLE = {408, 429}
# Failures that a retry cannot fix: the endpoint's configuration must change.
_DEAD = {
    "SsrfRefused": "",
    "InvalidUrl": "",
    "InvalidHeader": "; the effect's key cannot be sent as a header",
}


def redacted_excerpt(answer: Answer, note: str = "") -> str:
    """Status line, headers (values outside ``_SHOWN`` redacted) and the start of
    the body; raw (``delivery`` cleans it). Stops adding headers once the excerpt is full."""
    lines = [f"HTTP {answer.status} {answer.reason}".rstrip()]
    size = len(lines[0])
    for name, value in answer.headers:
        if size > outside.EXCERPT_BYTES:
            break
        line = f"{name}: {value if name.lower() in _SHOWN else '[redacted]'}"
        lines.append(line)
        size += len(line) + 1
    text = "\n".join(lines) + "\n\n" + bytes(answer.body).decode("utf-8", errors="replace")
    return f"{text}\n[{note}]" if note else text


def classify(status: int, location: str | None) -> tuple[str, str | None]:
    """Outcome and reason for an HTTP status (see the outcome rules in docs/dispatcher.md)."""
    if 200 <= status < 300:
        return "delivered", None
    if status == 410:
        return "gone", "410 Gone: the receiver retired this endpoint; endpoint paused"
    if status in _RETRYABLE or status >= 500:
        return "retry", f"HTTP {status}"
    if 300 <= status < 400:
        return "dead", f"HTTP {status}: redirect not followed (Location: {location or '-'})"
    return "dead", f"HTTP {status}: the receiver refused the request"


def failed(failure: Failure) -> Sent:
    """A send that got no usable status: the error class and the outcome."""
    if failure.kind in _DEAD:
        # Not retried: the address is refused by policy (a retry would resolve to
        # the same place), or the URL cannot work. Fix the endpoint, then requeue.
        return Sent("dead", error_class=failure.kind, error=failure.detail + _DEAD[failure.kind])
    # Handed over: no status line, or an answer that broke HTTP after it (its
    # receiver got the whole request and answered something unreadable): for an
    # endpoint that cannot deduplicate it ends 'uncertain', not resent.
    return Sent(
        "retry", error_class=failure.kind, error=failure.detail, handed_over=failure.outcome_unknown
    )


class WebhookChannel:
    """Holds the pool; ``send`` is safe to call from many tasks at once."""

    def __init__(self, settings: Settings, pool_size: int) -> None:
        self._settings = settings
        self._pool_size = pool_size
        self._client: Client | None = None
        # Per endpoint secret, built once: the HMAC key.
        self._secrets: dict[str, bytes] = {}
        # Per endpoint name: (the endpoint as loaded, its signing keys, until when
        # they hold as wall-clock seconds) (``_keys``).
        self._signing: dict[str, tuple[Endpoint, list[bytes], float]] = {}

    async def start(self) -> None:
        self._client = Client(
            self._pool_size, self._settings.ssrf_allow_networks, ssl.create_default_context()
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _keys(self, endpoint: Endpoint) -> list[bytes]:
        """The HMAC keys a delivery to ``endpoint`` is signed with (its active secrets),
        worked out once per endpoint as loaded (a reload is a new object: worked out
        again) and kept until the soonest overlap of an earlier secret ends. Per send
        they were ~4 % of a dispatcher's CPU (a profile of a drain, bench/RESULTS.md)."""
        now = time.time()
        kept = self._signing.get(endpoint.name)
        if kept is not None and kept[0] is endpoint and now < kept[2]:
            return kept[1]
        at = dt.datetime.fromtimestamp(now, dt.UTC)
        keys = [self._secret(text) for text in endpoint.active_secrets(at)]
        ends = endpoint.overlapping_until(at)
        self._signing[endpoint.name] = (endpoint, keys, ends[0].timestamp() if ends else math.inf)
        return keys

    def _secret(self, text: str) -> bytes:
        """The HMAC key of a whsec_ secret, decoded once."""
        key = self._secrets.get(text)
        if key is None:
            key = self._secrets[text] = secret_bytes(text)
        return key

    async def send(
        self, endpoint: Endpoint, effect: Claimed, timeout_s: float, start: Start | None = None
    ) -> Sent:
        """POST the payload, signed; never raises for a delivery problem. ``start``:
        asked right before the request is written (the time it takes comes off the
        send's deadline)."""
        assert self._client is not None, "start() the channel first"
        if start is not None:
            if past_send_by(effect):  # before a start is recorded for nothing
                return expired("before the request was started")
            t0 = time.monotonic()
            if not await start():
                return Sent(NOT_STARTED)
            timeout_s = max(0.001, timeout_s - (time.monotonic() - t0))
        body = effect.payload.encode("utf-8")
        headers = signing.headers(
            self._keys(endpoint), effect.idempotency_key, int(time.time()), body
        )
        if effect.trace is not None:  # tracing on: traceparent (and tracestate)
            headers.update(effect.trace.headers)
        try:
            target = self._client.target(endpoint.url or "")
            answer = await self._client.post(
                target, headers.items(), body, timeout_s, effect.send_by
            )
        except Failure as failure:
            if failure.kind == "Expired":
                return expired("before the request's first byte (connection ready)")
            return failed(failure)
        outcome, reason = classify(answer.status, answer.header("Location"))
        note = answer.body_error or ""
        return Sent(
            outcome=outcome,
            status_code=answer.status,
            error=reason,
            error_class="BadBody" if answer.body_error else None,
            response_excerpt=redacted_excerpt(answer, note),
            retry_after_s=parse_retry_after(answer.header("Retry-After")),
        )
