"""The worker loop: claim due effects under a lease, send them, record the outcomes.

At-least-once by nature: an effect is recorded only after it was sent, so a
crash between the send and the record makes it be sent again (with the same
``webhook-id``/``Message-ID``) once its lease expires; except to an endpoint
that cannot deduplicate: its sends record their start first, and an expired
lease of a started send ends 'uncertain' for an operator to decide
(``starts``, docs/dispatcher.md "Uncertain sends"). Everything here is safe
to repeat: records are fenced by the lease token in SQL, and a delivered key is
never sent again (its row while it is there, the key ledger after).

Shape (after procrastinate): one loop waits on "work, or stop, or the poll
timer" and queues what it claims for ``concurrency`` senders (long-lived
tasks, each sending one effect at a time); ``stop()`` only sets an event;
side tasks (listener, recorder, heartbeat, settle_uncertain, park, expire,
fold_counts, loop_lag, progress; retention and auto_disable when configured) are named, the
periodic ones all one loop (``periodic.every``), and a crash of any of them or of a sender stops
the worker with a non-zero exit; signals are installed by the CLI, not here.
Nothing a receiver or an effect's data does can crash a side task or a sender:
every attempt ends as a recorded outcome (``delivery``, ``recorder``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import socket
import time
import uuid

from sqlalchemy.engine import Engine

from spark_outbox.core import outside, tracing
from spark_outbox.core.queue import QueueStats
from spark_outbox.core.settings import Settings
from spark_outbox.core.wakeup import Listener
from spark_outbox.dispatch import periodic, progress, retention, store
from spark_outbox.dispatch.dbcalls import DbCalls
from spark_outbox.dispatch.delivery import Delivery
from spark_outbox.dispatch.lanes import Lanes
from spark_outbox.dispatch.metrics import Metrics, watch_loop_lag
from spark_outbox.dispatch.recorder import Recorder
from spark_outbox.dispatch.rounds import Rounds
from spark_outbox.dispatch.traces import Traces

log = logging.getLogger(__name__)

# Parking passes in a row, at most, before the next poll interval (each looks at
# store.PARK_WINDOW rows of each ordered endpoint).
PARK_PASSES = 100


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class Worker:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        *,
        database_url: str,
        until_idle: bool = False,
        idle_within_s: float | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.worker_id = settings.worker_id or default_worker_id()
        self.until_idle = until_idle
        # --until-idle: stop when nothing is due within this horizon (default: one poll).
        self.idle_within_s = settings.poll_interval_s if idle_within_s is None else idle_within_s
        self.metrics = metrics or Metrics()
        self._engine = engine
        self._url = database_url
        self._db = DbCalls(engine)
        self._stopping = asyncio.Event()
        self._wake = asyncio.Event()
        self._crash: BaseException | None = None
        # Claimed effects wait here for one of ``concurrency`` senders (long-lived
        # tasks: a task per effect and a semaphore cost ~10 % of the process's CPU),
        # each in its endpoint's line, the lines served in turn (``rounds``).
        self._waiting: Rounds[store.Claimed] = Rounds()
        # Sends at once per endpoint that cannot deduplicate (``lanes``).
        self._lanes: Lanes[store.Claimed] = Lanes(settings.nondedup_concurrency)
        self._held = 0  # claimed, not yet through a sender (waiting or being sent)
        self._none_held = asyncio.Event()
        self._unrecorded = 0  # claimed, not yet recorded (idle needs 0)
        self._more_due = False  # the last claim took all it asked for
        self._news = False  # woken (NOTIFY, a listener back) since the last claim
        self._statements = store.Statements.from_settings(settings)
        # Tracing (OTEL_* variables): None when off, and then nothing below is traced.
        tracer = tracing.tracer()
        self._traces = None if tracer is None else Traces(tracer, self.worker_id)
        self._claim = self._statements.claim
        if self._traces is not None:
            self._claim = self._traces.claim(self._statements.claim)
        self._recorder = Recorder(
            self._db,
            self.worker_id,
            self.metrics,
            batch_size=settings.claim_batch_size,
            give_up_s=max(120.0, settings.lease_s),
            recorded=self._settled,
            statements=self._statements,
            traces=self._traces,
        )
        self._queue = QueueStats(depth=0, oldest_due_age_s=0.0)
        # The progress line's last counts and when they were taken.
        self._progress_from: tuple[collections.Counter[str], float] = (collections.Counter(), 0.0)

    @property
    def delivered(self) -> int:
        return self._recorder.counts["delivered"]

    @property
    def failed(self) -> int:
        return self._recorder.counts.total() - self.delivered

    def stop(self) -> None:
        """Ask the worker to stop: no new claims; in-flight sends are finished."""
        self._stopping.set()
        self._wake.set()

    def wake(self, news: bool = True) -> None:
        """New work (NOTIFY): claim now, or, when ``news``, as soon as a record frees
        any room; a successor of an ordered key is claimed with the next batch
        (``wakeup.SUCCESSORS``)."""
        self._news = self._news or news
        self._wake.set()

    async def run(self) -> int:
        """Run until stopped (or idle, with ``until_idle``); 0 on a clean stop."""
        delivery = Delivery(self.settings, self._db, self.metrics, self._traces)
        await delivery.start()
        self.metrics.in_flight.set_function(lambda: self._held)  # read when scraped
        senders = [
            asyncio.create_task(self._sender(delivery), name=f"sender-{i}")
            for i in range(self.settings.concurrency)
        ]
        s, every = self.settings, functools.partial(periodic.every, stop=self._stopping)
        steps = {
            "listener": Listener(self.settings.listen_database_url or self._url, self.wake).run(),
            "recorder": self._recorder.run(),
            "heartbeat": every(s.heartbeat_interval_s, self._heartbeat),
            # Expired leases of started sends become 'uncertain' (claimable_effects
            # never offers them meanwhile; docs/dispatcher.md).
            "settle_uncertain": every(s.heartbeat_interval_s, self._settle_once),
            "park": every(s.poll_interval_s, self._park),
            # Effects past their send-by time end 'expired' (the claim already skips
            # them; this says so, and wakes an ordered key's successor).
            "expire": every(s.poll_interval_s, self._expire),
            # The effect counts status and /metrics sum stay a few rows (core.counts).
            "fold_counts": every(s.heartbeat_interval_s, self._fold_counts),
            # The event loop's lag: a saturated process, seen from /metrics.
            "loop_lag": watch_loop_lag(self.metrics.loop_lag, stop=self._stopping),
        }
        if s.retention_older_than_s > 0:  # OUTBOX_RETENTION_OLDER_THAN
            purge = functools.partial(retention.purge_once, self._db, s, self.worker_id)
            steps["retention"] = every(s.retention_interval_s, purge)
        if s.auto_disable_after_s > 0:  # OUTBOX_AUTO_DISABLE_AFTER_S
            steps["auto_disable"] = every(s.heartbeat_interval_s, self._auto_disable)
        if s.progress_interval_s > 0:
            self._progress_from = self._recorder.counts.copy(), time.monotonic()
            steps["progress"] = every(s.progress_interval_s, self._progress, wait_first=True)
        side = {name: asyncio.create_task(step, name=name) for name, step in steps.items()}
        for task in [*side.values(), *senders]:
            task.add_done_callback(self._side_task_done)  # a sender never ends but cancelled
        log.info("worker started", extra={"event": "worker.started", "worker_id": self.worker_id})
        try:
            await self._loop()
        finally:
            await self._shutdown(delivery, side, senders)
        return 1 if self._crash is not None else 0

    def _side_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        if self._stopping.is_set() and task.exception() is None:
            return  # the recorder after its last batch, a periodic task when stopping
        self._crash = task.exception() or RuntimeError(f"side task {task.get_name()} returned")
        log.error(
            "side task crashed; stopping",
            extra={"event": "worker.crashed", "task": task.get_name(), "error": repr(self._crash)},
        )
        self.stop()

    async def _loop(self) -> None:
        s = self.settings
        while not self._stopping.is_set():
            self._wake.clear()
            room = self._room()
            if room <= 0:
                self._more_due = True  # held back: claim as soon as records free room
            else:
                self._news = False  # this claim sees whatever was notified so far
                started = time.monotonic()
                claim = await self._db.call(
                    self._claim, self.worker_id, room, s.lease_s, until=self._stopping
                )
                self.metrics.claim_seconds.observe(time.monotonic() - started)
                for effect in claim.effects if claim is not None else []:
                    self._unrecorded += 1
                    self._held += 1
                    self._waiting.put_nowait(effect)
                self._more_due = claim is not None and claim.full
                if self._more_due:
                    continue  # more may be due right now
            if self.until_idle and await self._idle():
                log.info("nothing due: idle", extra={"event": "worker.idle"})
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), s.poll_interval_s)

    async def _idle(self) -> bool:
        if self._held or self._unrecorded:
            return False
        await self._settle_once()  # idle means nothing is left leased and expired
        await self._expire()  # ... nor waiting past its send-by time
        due = await self._db.call(store.due_soon, self.idle_within_s)
        return due is False

    async def _sender(self, delivery: Delivery) -> None:
        """One of ``concurrency``: sends claimed effects one after another, for ever.
        An effect of an endpoint that cannot deduplicate is sent in one of its lanes
        (``lanes``): when all are taken it waits in its endpoint's line, and this
        sender goes on with the next effect."""
        while True:
            effect: store.Claimed | None = await self._waiting.get()
            assert effect is not None
            laned = not await delivery.deduplicates(effect.endpoint)
            if laned and not self._lanes.enter(effect):
                continue
            while effect is not None:
                await self._attempt(delivery, effect)
                effect = self._lanes.leave(effect.endpoint) if laned else None

    async def _attempt(self, delivery: Delivery, effect: store.Claimed) -> None:
        try:
            outcome = await delivery.attempt(effect)
        except Exception as exc:  # never leave a claimed effect unaccounted
            log.error(
                "attempt failed before sending; lease handed back",
                extra={"event": "attempt.failed", "idempotency_key": effect.idempotency_key}
                | outside.failure(exc),
            )
            outcome = store.Release(effect.id, effect.lease_token, self.settings.poll_interval_s)
        self._recorder.queue.put_nowait(outcome)
        self._sent()

    def _room(self) -> int:
        """How many effects the next claim may take. A worker holds at most one batch
        more than its sends in flight (the next effects are claimed while the current
        ones are sent), counted until their outcomes are recorded, not just sent: what
        a crash can lose (sent, not yet recorded: sent again, or uncertain) stays
        within ``concurrency + claim_batch_size`` however fast the sends and however
        slow the records (a stalled record once let a worker go on claiming and
        sending, every outcome held in memory only)."""
        s = self.settings
        return min(s.claim_batch_size, s.concurrency + s.claim_batch_size - self._unrecorded)

    def _settled(self, count: int) -> None:
        self._unrecorded -= count
        if self.until_idle and not self._unrecorded:
            self._wake.set()  # the idle check waits for the last records
        elif self._more_due and self._room() >= self._claim_at():
            # The last claim was full (a backlog) and there is room enough: claim again.
            # Without a backlog, new work wakes the loop (NOTIFY, the poll): a wake per
            # record was an empty claim per record at a low rate.
            self._wake.set()

    def _claim_at(self) -> int:
        """The room a backlogged worker waits for before it claims again: half a batch
        (claims are then about half a batch: each pays its planning and commit), but
        any room once new work was notified: a fresh effect of another endpoint is
        not gated on half a batch of the backlog's sends (its fair share of the
        claim, store.sql, takes it)."""
        return 1 if self._news else max(1, self.settings.claim_batch_size // 2)

    def _sent(self) -> None:
        self._held -= 1
        if not self._held:
            self._none_held.set()

    async def _heartbeat(self) -> None:
        await self._db.call(
            store.heartbeat, self.worker_id, self._held, self.delivered, self.failed
        )
        # Beside a large backlog one dispatcher a heartbeat counts it (core.queue).
        stats = await self._db.call(store.queue_stats, self.settings.heartbeat_interval_s)
        if stats is not None:
            self._queue = stats
            self.metrics.queue_depth.set(stats.depth)
            self.metrics.oldest_due_age.set(stats.oldest_due_age_s)

    async def _fold_counts(self) -> None:
        await self._db.call(store.fold_counts)

    async def _park(self) -> None:
        """Ordered endpoints' effects waiting behind an earlier one of their key leave
        the claim's range (store.park_blocked); pass after pass while a pass parks
        some, at most PARK_PASSES in a row."""
        for _ in range(PARK_PASSES):
            if not await self._db.call(store.park_blocked):
                break

    async def _expire(self) -> None:
        """Effects past their send-by time end 'expired' (store.expire_due), pass after
        pass while a pass moves a full batch."""
        while True:
            found = await self._db.call(store.expire_due) or []
            for key, endpoint in found:
                self.metrics.expired.labels(endpoint).inc()
                log.info(
                    "send-by time passed: expired, never sent",
                    extra={"event": "effect.expired", "idempotency_key": key}
                    | {"endpoint": endpoint},
                )
            if len(found) < store.EXPIRE_LIMIT:
                return

    async def _settle_once(self) -> None:
        for key, endpoint in await self._db.call(store.settle_uncertain) or []:
            self.metrics.delivery(endpoint, "uncertain").inc()
            log.warning(
                "send started, lease expired: uncertain, not sent again",
                extra={"event": "effect.uncertain", "idempotency_key": key}
                | {"endpoint": endpoint},
            )

    async def _auto_disable(self) -> None:
        """Disable endpoints failing for too long (one dispatcher does it; the others
        find nothing left to do)."""
        await self._db.call(store.auto_disable, self.settings.auto_disable_after_s)

    async def _progress(self) -> None:
        """One INFO line: what was settled since the last line, the queue, and the
        endpoints held back with why (``progress``)."""
        last, last_at = self._progress_from
        now, counts = time.monotonic(), self._recorder.counts.copy()
        states = await self._db.call(store.endpoint_states) or []
        fields = progress.fields(counts - last, now - last_at, self._queue, self._held, states)
        text = progress.line(fields, now - last_at)
        log.info(text, extra={"event": "worker.progress"} | fields)
        self._progress_from = counts, now

    async def _shutdown(
        self,
        delivery: Delivery,
        side: dict[str, asyncio.Task[None]],
        senders: list[asyncio.Task[None]],
    ) -> None:
        """Finish in-flight sends (up to the timeout), hand back unsent leases,
        flush the outcomes, say we stopped. Sends cut off by the timeout stay
        leased: they are sent again once the lease expires (at-least-once), or, to an
        endpoint that cannot deduplicate, end 'uncertain'."""
        self._stopping.set()
        delivery.hold_unstarted()  # the senders hand back what is still waiting
        if self._held:
            self._none_held.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._none_held.wait(), self.settings.shutdown_timeout_s)
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        await self._recorder.queue.put(None)
        recorder = side.pop("recorder")
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(recorder), self.settings.shutdown_timeout_s)
        for task in side.values():
            task.cancel()
        await asyncio.gather(*side.values(), return_exceptions=True)
        await delivery.close()
        with contextlib.suppress(Exception):
            await self._db.call(store.heartbeat_stopped, self.worker_id, give_up_after_s=5.0)
        self._db.close()
        if self._traces is not None:
            with contextlib.suppress(Exception):  # a collector away must not fail the stop
                await asyncio.to_thread(tracing.flush)
        log.info(
            "worker stopped",
            extra={"event": "worker.stopped", "delivered": self.delivered, "failed": self.failed},
        )
