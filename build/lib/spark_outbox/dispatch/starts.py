"""Send starts: "this send started", recorded durably before a send to an endpoint
that cannot deduplicate (docs/dispatcher.md, "Uncertain sends").

The sends that get their turn together share one statement (``store.start_sends``,
a group commit): the first to arrive starts a flush, the others join it, and
those arriving while it runs make the next one. A send whose start was not
recorded (its lease was lost, or the database stayed away) is not sent.
"""

from __future__ import annotations

import asyncio
import logging

from spark_outbox.core import outside
from spark_outbox.dispatch import store
from spark_outbox.dispatch.dbcalls import DbCalls

log = logging.getLogger(__name__)


class SendStarts:
    def __init__(self, db: DbCalls, give_up_s: float) -> None:
        self._db = db
        self._give_up_s = give_up_s
        self._waiting: list[tuple[int, str, asyncio.Future[bool]]] = []
        self._flushing: asyncio.Task[None] | None = None

    async def start(self, effect: store.Claimed) -> bool:
        """True once the start is durable and the lease still ours: send now."""
        started: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._waiting.append((effect.id, effect.lease_token, started))
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.create_task(self._flush(), name="send_starts")
        return await started

    async def _flush(self) -> None:
        while self._waiting:
            await asyncio.sleep(0)  # the sends that got their turn in this tick join in
            batch, self._waiting = self._waiting, []
            leases = [(effect_id, token) for effect_id, token, _ in batch]
            try:
                ours = await self._db.call(
                    store.start_sends, leases, give_up_after_s=self._give_up_s
                )
            except Exception as exc:  # not sent; the lease is handed back or expires
                log.error(
                    "send starts not recorded; those sends are not made",
                    extra={"event": "send.start_failed", "effects": len(batch)}
                    | outside.failure(exc),
                )
                ours = None
            for effect_id, _, started in batch:
                if not started.done():
                    started.set_result(ours is not None and effect_id in ours)
