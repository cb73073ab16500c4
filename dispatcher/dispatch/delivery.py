"""One attempt at one effect: find its endpoint, send it through the right
channel, time it, and turn the answer into a ``store.Result`` (with the retry
delay decided by the schedule and ``Retry-After``).

Limits are not kept here: the claim takes at most what an endpoint's shared
budget allows (rate limit, ``max_in_flight``) and nothing of a resting or paused
endpoint. What was claimed before an endpoint began to rest (every dispatcher
sees it within ``ENDPOINT_CACHE_S``) or was paused (a 410, here at once) is
handed back unsent.

Send-by times: an effect whose send-by time has come (``store.Claimed.send_by``)
is never sent: checked here before a send starts, and by the channel right
before the first byte; the attempt is recorded 'expired' (nothing was sent).

Every text of a ``Result`` that can carry outside data (the error, its class,
the response excerpt) is cleaned here, once (``outside.clean``), so neither
``record`` nor a log line ever sees a receiver's raw bytes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import time

from spark_outbox.core import endpoints, outside
from spark_outbox.core.endpoints import Endpoint
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import retry, store
from spark_outbox.dispatch.channels import NOT_STARTED, Channel, Sent, expired, past_send_by
from spark_outbox.dispatch.channels.smtp import EmailChannel
from spark_outbox.dispatch.channels.webhook import WebhookChannel
from spark_outbox.dispatch.dbcalls import DbCalls
from spark_outbox.dispatch.metrics import Metrics
from spark_outbox.dispatch.starts import SendStarts
from spark_outbox.dispatch.traces import Traces

log = logging.getLogger(__name__)

ENDPOINT_CACHE_S = 2.0
_LATE = expired("while it waited for a sender, before its send started")


class Delivery:
    def __init__(
        self, settings: Settings, db: DbCalls, metrics: Metrics, traces: Traces | None = None
    ) -> None:
        self._settings = settings
        self._db = db
        self._metrics = metrics
        self._channels: dict[str, Channel] = {
            "webhook": WebhookChannel(settings, settings.concurrency),
            "email": EmailChannel(settings),
        }
        self._endpoints: dict[str, Endpoint] = {}
        self._loaded_at = float("-inf")
        self._loading: asyncio.Future[None] | None = None
        self._hold = asyncio.Event()
        self._gone: set[str] = set()  # answered 410 here; paused until its row changes
        self._starts = SendStarts(db, give_up_s=settings.lease_s / 4)
        self._traces = traces  # None: tracing is off

    async def start(self) -> None:
        for channel in self._channels.values():
            await channel.start()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()

    def hold_unstarted(self) -> None:
        """Shutdown: effects not yet started are handed back, not sent."""
        self._hold.set()

    async def _endpoint(self, name: str) -> Endpoint | None:
        """From a cache refreshed every ENDPOINT_CACHE_S by one load at a time: no
        per-effect lookups, no stampede. A send waits for a load only when its
        endpoint is not in the cache; a stale cache is refreshed in the background
        while sends go on with it (a send never waits behind a database round trip
        it does not need: that wait was in the latency's tail, docs/dispatcher.md)."""
        known = self._endpoints.get(name)
        stale = time.monotonic() - self._loaded_at > ENDPOINT_CACHE_S
        if known is not None and not stale:
            return known
        if self._loading is None or self._loading.done():
            self._loading = asyncio.ensure_future(self._load())
            self._loading.add_done_callback(_load_done)
        if known is None:
            await asyncio.shield(self._loading)
            return self._endpoints.get(name)
        return known

    async def deduplicates(self, name: str) -> bool:
        """Whether the endpoint's receiver deduplicates (an unknown one counts as
        deduplicating: its effects end dead, nothing is sent)."""
        endpoint = await self._endpoint(name)
        return endpoint is None or endpoint.deduplicates

    async def _load(self) -> None:
        found = await self._db.call(_load_endpoints)
        if found is not None:
            for ep in found.values():
                old = self._endpoints.get(ep.name)
                if old is not None and old.updated_at != ep.updated_at:
                    self._gone.discard(ep.name)  # resumed or reconfigured
            self._endpoints, self._loaded_at = found, time.monotonic()

    async def attempt(self, effect: store.Claimed) -> store.Result | store.Release:
        """Send once, or hand the lease back unsent (shutdown, paused or resting endpoint).
        The caller bounds how many run at once (the worker's senders)."""
        if self._hold.is_set():
            return store.Release(effect.id, effect.lease_token)
        return await self._attempt(effect)

    async def _attempt(self, effect: store.Claimed) -> store.Result | store.Release:
        endpoint = await self._endpoint(effect.endpoint)
        if endpoint is not None:
            rest_s = self._rest_s(endpoint)
            if rest_s is not None:
                # Paused: due at once, but nobody claims it until an operator resumes
                # it; resting: due when the rest ends.
                return store.Release(effect.id, effect.lease_token, rest_s)
            if past_send_by(effect):
                # Its send-by time came while it waited for a sender: never sent. (The
                # channel asks again right before the first byte.)
                return self._result(effect, endpoint, _LATE, dt.datetime.now(dt.UTC), 0.0)
            left_s = effect.lease_deadline - time.monotonic()
            if left_s < self._settings.lease_s / 2:
                # Waited too long for its turn: sending now could outlive the lease
                # and race a worker that re-claimed it. Hand it back instead.
                return store.Release(effect.id, effect.lease_token)
        span = None
        if self._traces is not None:
            span = self._traces.send_started(effect, endpoint.kind if endpoint else "unknown")
        started_at = dt.datetime.now(dt.UTC)
        t0 = time.perf_counter()
        if endpoint is None:
            sent = Sent("dead", error_class="UnknownEndpoint", error="endpoint is not registered")
        else:
            # A send never outlives its lease (on our clock): the timeout is capped by it.
            timeout_s = max(
                0.001, min(endpoint.timeout_s, effect.lease_deadline - time.monotonic())
            )
            sent = await self._send(endpoint, effect, timeout_s)
            if sent.outcome == NOT_STARTED:
                # Its start could not be recorded (lease lost, database away): an
                # unrecorded start is not sent (docs/dispatcher.md, "Uncertain sends").
                return store.Release(effect.id, effect.lease_token)
            if sent.outcome == "gone":
                self._gone.add(endpoint.name)
        duration_s = time.perf_counter() - t0
        self._metrics.attempt_time(effect.endpoint).observe(duration_s)
        result = self._result(effect, endpoint, sent, started_at, duration_s * 1000)
        if span is not None and self._traces is not None:
            self._traces.send_ended(span, result)
        return result

    def _rest_s(self, endpoint: Endpoint) -> float | None:
        """Seconds to hand the effect back for (None: send now)."""
        if endpoint.name in self._gone or not endpoint.enabled:
            return 0.0
        until = endpoint.resting_until
        if until is None:
            return None
        left_s = (until - dt.datetime.now(dt.UTC)).total_seconds()
        return left_s if left_s > 0 else None

    async def _send(self, endpoint: Endpoint, effect: store.Claimed, timeout_s: float) -> Sent:
        """The channel's answer; a channel bug becomes a recorded attempt, not a lost effect."""
        # To an endpoint that cannot deduplicate, the channel records the send's start
        # right before the message goes out (``starts``).
        start = None if endpoint.deduplicates else functools.partial(self._starts.start, effect)
        try:
            return await self._channels[endpoint.kind].send(endpoint, effect, timeout_s, start)
        except Exception as exc:  # an attempt always ends recorded
            log.error(
                "channel failed",
                extra={"event": "send.unexpected", "idempotency_key": effect.idempotency_key}
                | outside.failure(exc),
            )
            return Sent("retry", error_class="Unexpected", error=f"{type(exc).__name__}: {exc}")

    def _result(
        self,
        effect: store.Claimed,
        endpoint: Endpoint | None,
        sent: Sent,
        started_at: dt.datetime,
        duration_ms: float,
    ) -> store.Result:
        outcome, delay_s, error = sent.outcome, 0.0, sent.error
        if sent.handed_over and endpoint is not None and not endpoint.deduplicates:
            # Handed over, no answer (or none readable): the receiver may have it and
            # cannot deduplicate.
            outcome = "uncertain"
            what = "no answer" if sent.error_class != "BadResponse" else "no readable answer"
            error = (
                f"handed over, then {what} ({sent.error}): the receiver may have it; "
                "not sent again automatically: mark it delivered or send it again"
            )
        if outcome == "retry":
            schedule = (endpoint and endpoint.retry_schedule_s) or self._settings.retry_schedule_s
            delay = retry.delay_with_retry_after(
                effect.attempt, schedule, sent.retry_after_s, self._settings.retry_after_cap_s
            )
            if delay is None:
                outcome = "dead"
                error = f"retries exhausted after {effect.attempt} attempts; last: {sent.error}"
            else:
                delay_s = delay
        return store.Result(
            effect_id=effect.id,
            lease_token=effect.lease_token,
            attempt=effect.attempt,
            outcome=outcome,
            started_at=started_at,
            duration_ms=duration_ms,
            delay_s=delay_s,
            error=outside.clean(error),
            status_code=sent.status_code,
            error_class=outside.clean(sent.error_class, outside.CLASS_CHARS, outside.CLASS_CHARS),
            response_excerpt=outside.clean(
                sent.response_excerpt, outside.EXCERPT_CHARS, outside.EXCERPT_BYTES
            ),
            endpoint=effect.endpoint,
            idempotency_key=effect.idempotency_key,
        )


def _load_done(loading: asyncio.Future[None]) -> None:
    """A background refresh that failed: logged; the next send past the cache age retries."""
    exc = None if loading.cancelled() else loading.exception()
    if exc is not None:
        log.error(
            "endpoint refresh failed",
            extra={"event": "endpoints.load_failed"} | outside.failure(exc),
        )


def _load_endpoints(engine: object) -> dict[str, Endpoint]:
    from sqlalchemy.engine import Engine

    assert isinstance(engine, Engine)
    with engine.connect() as conn:
        return {e.name: e for e in endpoints.list_all(conn)}
