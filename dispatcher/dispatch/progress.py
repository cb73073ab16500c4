"""The worker's progress line: what it settled since the last line, the queue, and
the endpoints held back with why.

"0 delivered" alone does not say why nothing is sent: an endpoint resting under the
circuit breaker, paused, disabled, at its in-flight limit or out of rate-limit
tokens is named with its reason (``spark_outbox.core.endpoint_state``, read from
the data the claim obeys). Text logs get one line; JSON logs the same facts as
fields (``held_back``: every endpoint held back, not only the first few).
"""

from __future__ import annotations

import collections
from typing import Any

from spark_outbox.core.endpoint_state import EndpointState
from spark_outbox.core.queue import QueueStats

# At most this many endpoints held back in the text (all of them in the fields);
# a ready or archived endpoint is not held back.
HELD_BACK_SHOWN = 5
NOT_HELD_BACK = ("ready", "archived")


def fields(
    since: collections.Counter[str],
    seconds: float,
    queue: QueueStats,
    in_flight: int,
    states: list[EndpointState],
) -> dict[str, Any]:
    """The line's facts: ``since`` counts outcomes recorded over ``seconds``."""
    return {
        "delivered": since["delivered"],
        "retried": since["retry"],
        "dead": since["dead"] + since["gone"],
        "rate_per_s": round(since["delivered"] / max(seconds, 1e-9), 1),
        "queue_depth": queue.depth,
        "in_flight": in_flight,
        "held_back": [
            {"endpoint": e.name, "state": e.state, "why": e.why, "due": e.queue.depth}
            for e in states
            if e.state not in NOT_HELD_BACK
        ],
    }


def line(f: dict[str, Any], seconds: float) -> str:
    text = (
        f"progress: {f['delivered']:,} delivered, {f['retried']:,} retried, {f['dead']:,} dead "
        f"in the last {seconds:.0f} s ({f['rate_per_s']:,.1f}/s); "
        f"queue depth {f['queue_depth']:,}, {f['in_flight']:,} in flight"
    )
    held = f.get("held_back") or []
    for e in held[:HELD_BACK_SHOWN]:
        text += f"; {e['endpoint']} ({e['due']:,} due): {e['why']}"
    if len(held) > HELD_BACK_SHOWN:
        text += f"; {len(held) - HELD_BACK_SHOWN} more held back (GET /v1/status)"
    return text
