"""The audit-log writer: every operator action, and every change the system makes.

An action's ``operator_actions`` row is written in the same transaction as the
change itself (the caller's connection), so there is no change without its record
and no record of a change that did not happen. The console's operator writes, the
hot path's maintenance (retention) and the Spark sink's volume guard all write here.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.core.errors import InvalidRequest
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "auditlog.sql")

# The one actor of every change the system makes by itself (a 410's pause, the
# automatic disable, a breaker's rest, a held batch, a retention run), as an
# operator's name is of theirs; no token may take it (console/tokens.py). The SQL
# that writes such rows in its own statement (dispatch/store.sql) spells it too.
SYSTEM_ACTOR = "system"
log = logging.getLogger(__name__)


def check_reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise InvalidRequest("reason", "is empty", "say why, e.g. 'receiver fixed, ticket 4711'")
    if "\x00" in reason:
        raise InvalidRequest("reason", "contains a NUL character", "send plain text")
    return reason.strip()


def record_action(
    conn: Connection,
    *,
    actor: str,
    action: str,
    target: str,
    reason: str,
    details: dict[str, Any] | None = None,
) -> int:
    params = {
        "actor": actor,
        "action": action,
        "target": target,
        "reason": check_reason(reason),
        "details": json.dumps(details or {}, default=str),
    }
    action_id = int(conn.execute(_Q["record_action"], params).scalar_one())
    log.info(
        "operator action",
        extra={
            "event": f"operator.{action}",
            "actor": actor,
            "target": target,
            "action_id": action_id,
        },
    )
    return action_id
