"""The recorder side task: outcomes go to ``store.record`` in batches, and one bad
row never stops it.

A batch that fails for any reason but "the database is unavailable" (which
``DbCalls`` retries) is split in halves until the rows that fail alone are
found; the others are recorded as usual. A row that fails alone is recorded
once more with its outside texts replaced by a short explanation
(``RecordFailed``), and if even that fails it is logged at ERROR and left to
its lease (sent again when the lease expires): never retried forever, never
dropped without a word.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from collections.abc import Callable

from spark_outbox.core import outside
from spark_outbox.core.errors import DatabaseUnavailable
from spark_outbox.dispatch import store
from spark_outbox.dispatch.dbcalls import DbCalls
from spark_outbox.dispatch.metrics import Metrics
from spark_outbox.dispatch.traces import Traces

log = logging.getLogger(__name__)

Item = store.Result | store.Release | None


class Recorder:
    def __init__(
        self,
        db: DbCalls,
        worker_id: str,
        metrics: Metrics,
        *,
        batch_size: int,
        give_up_s: float,
        recorded: Callable[[int], None],
        statements: store.Statements | None = None,
        traces: Traces | None = None,
    ) -> None:
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self._db = db
        self._worker_id = worker_id
        self._metrics = metrics
        self._batch_size = batch_size
        self._give_up_s = give_up_s
        self._recorded = recorded  # told how many claimed effects are settled
        self._statements = statements or store.Statements()  # how records run
        self._traces = traces  # None: tracing is off
        # Recorded outcomes by name (delivered, retry, dead, gone, stale, unrecorded).
        self.counts: collections.Counter[str] = collections.Counter()

    async def run(self) -> None:
        """Record until a None arrives (the worker's shutdown), batch by batch."""
        done = False
        while not done:
            batch: list[store.Result | store.Release] = []
            item = await self.queue.get()
            while item is not None:
                batch.append(item)
                if len(batch) >= self._batch_size or self.queue.empty():
                    break
                item = self.queue.get_nowait()
            done = item is None
            results = [r for r in batch if isinstance(r, store.Result)]
            releases = [r for r in batch if isinstance(r, store.Release)]
            if results:
                await self._record(results)
                self._recorded(len(results))
            if releases:
                await self._db.call(store.release, releases, give_up_after_s=60.0)
                self._recorded(len(releases))

    async def _record(self, batch: list[store.Result]) -> None:
        t0 = time.time_ns() if self._traces is not None else 0
        try:
            fresh = await self._db.call(
                self._statements.record,
                self._worker_id,
                batch,
                give_up_after_s=self._give_up_s,
            )
        except DatabaseUnavailable:
            raise  # outlasted the give-up time: the worker stops, leases expire
        except Exception as exc:  # one bad row must not sink the batch
            await self._split(batch, exc)
            return
        if self._traces is not None:
            self._traces.recorded(batch, fresh, t0)
        # Deliveries are counted per endpoint once a batch (an increment takes a lock);
        # every other outcome one by one, with its log line.
        delivered: collections.Counter[str] = collections.Counter()
        debug = log.isEnabledFor(logging.DEBUG)
        for r in batch:
            ok = fresh is not None and fresh.get((r.effect_id, r.lease_token), False)
            outcome = r.outcome if ok else "stale"
            if outcome != "delivered":
                self._count(r, outcome)
                continue
            delivered[r.endpoint] += 1
            if debug:
                log.debug("delivered", extra=_fields(r, "effect.delivered"))
        for endpoint, n in delivered.items():
            self.counts["delivered"] += n
            self._metrics.delivery(endpoint, "delivered").inc(n)

    async def _split(self, batch: list[store.Result], exc: Exception) -> None:
        if len(batch) > 1:
            half = len(batch) // 2
            await self._record(batch[:half])
            await self._record(batch[half:])
            return
        (bad,) = batch
        if bad.error_class == "RecordFailed":
            self._count(bad, "unrecorded")
            log.error(
                "attempt could not be recorded; its lease will expire and it is sent again",
                extra={"event": "record.failed", "idempotency_key": bad.idempotency_key}
                | outside.failure(exc),
            )
            return
        log.warning(
            "attempt refused by the database; recording it without its outside texts",
            extra={
                "event": "record.replaced",
                "idempotency_key": bad.idempotency_key,
                "error": f"{type(exc).__name__}",
            },
        )
        await self._record([safe_copy(bad, exc)])

    def _count(self, r: store.Result, outcome: str) -> None:
        """An outcome other than delivered (``_record`` counts those per batch), with
        its log line."""
        self.counts[outcome] += 1
        self._metrics.delivery(r.endpoint, outcome).inc()
        if outcome == "expired":
            self._metrics.expired.labels(r.endpoint).inc()
        level = logging.INFO if outcome == "retry" else logging.WARNING
        message = "lease lost; outcome not applied" if outcome == "stale" else "not delivered"
        extra = _fields(r, f"effect.{outcome}") | {
            "status_code": r.status_code,
            "error": r.error,
            "retry_in_s": round(r.delay_s, 3) if outcome == "retry" else None,
        }
        log.log(level, message, extra=extra)


def safe_copy(result: store.Result, exc: BaseException) -> store.Result:
    """The same outcome without any text that came from outside, and with finite
    numbers (JSON, how ``store.record`` sends a batch, has no NaN): what is always
    recordable."""
    return dataclasses.replace(
        result,
        error_class="RecordFailed",
        error=f"the attempt's texts were refused by the database ({type(exc).__name__}); "
        f"outcome {result.outcome}, status {result.status_code} kept",
        response_excerpt=None,
        delay_s=result.delay_s if math.isfinite(result.delay_s) else 0.0,
        duration_ms=result.duration_ms if math.isfinite(result.duration_ms) else 0.0,
    )


def _fields(r: store.Result, event: str) -> dict[str, object]:
    return {
        "event": event,
        "idempotency_key": r.idempotency_key,
        "endpoint": r.endpoint,
        "attempt": r.attempt,
    }
