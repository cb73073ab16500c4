"""Channels send one claimed effect to one endpoint and say what happened.

A channel never touches the database: it returns a ``Sent`` and the worker
records it. Channels classify the answer (delivered / retry / dead / gone); the
retry policy decides when. A channel never raises for anything a receiver or an
effect's data did: every such problem is a ``Sent`` with an error class. Texts
in a ``Sent`` may still hold the receiver's raw bytes: ``delivery`` cleans them
(``spark_outbox.core.outside.clean``) before they reach SQL or a log.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from spark_outbox.core.endpoints import Endpoint
    from spark_outbox.dispatch.store import Claimed


@dataclasses.dataclass(slots=True)  # one per delivery: see store.Claimed
class Sent:
    """What one attempt produced: ``outcome`` is delivered, retry, dead, gone or
    expired (its send-by time came before the first byte: nothing was sent), or
    ``NOT_STARTED``: nothing of the message went out, its start was refused."""

    outcome: str
    status_code: int | None = None
    error_class: str | None = None
    error: str | None = None
    response_excerpt: str | None = None
    retry_after_s: float | None = None
    # The whole message was handed over (SMTP: the DATA terminator written; HTTP:
    # the request fully written) and then no answer came: the receiver may have it.
    # For an endpoint that cannot deduplicate the attempt ends 'uncertain', not
    # retried (docs/dispatcher.md, "Uncertain sends").
    handed_over: bool = False


def past_send_by(effect: Claimed) -> bool:
    """Has the effect's send-by time come (on the worker's clock, never later than
    the database's: ``store.Claimed.send_by``)? Asked right before a send's first
    byte: from then on no byte of it may go out."""
    return effect.send_by is not None and time.monotonic() >= effect.send_by


def expired(where: str) -> Sent:
    """The attempt that stopped at the send-by check: nothing was sent."""
    return Sent(
        "expired",
        error_class="Expired",
        error=f"not sent: its send-by time came {where}",
    )


# Asked by a channel right before the first byte of the message itself goes out (the
# HTTP request; SMTP's DATA content, after the connection, MAIL and RCPT): the
# send to an endpoint that cannot deduplicate records that it started (``starts``).
# False: the start could not be recorded, so the message must not go out; the
# channel then returns ``NOT_STARTED``.
Start = Callable[[], Awaitable[bool]]
NOT_STARTED = "not_started"


class Channel(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def send(
        self, endpoint: Endpoint, effect: Claimed, timeout_s: float, start: Start | None = None
    ) -> Sent: ...
