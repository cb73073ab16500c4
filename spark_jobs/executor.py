"""Code that runs on Spark executors: nothing heavier than psycopg2 and the key helpers.

An import-linter contract keeps it so (pyproject.toml): an executor must be able
to run with PySpark, psycopg2 and this package, without the dispatcher's
HTTP/SMTP stack, SQLAlchemy or the API.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from dispatcher.errors import InvalidEffect
from dispatcher.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_RECIPIENT_CHARS,
    check_endpoint_name,
    check_key,
    check_not_before,
    check_optional_text,
    payload_bytes,
)


def effect_reject_reason(row: Mapping[str, Any]) -> str | None:
    """Why an effect row breaks the column contract, or None when it is good.

    The same checks as ``dispatcher.enqueue``; the reason names the field and
    the fix. Whether the endpoint exists is checked at commit, in SQL.
    """
    try:
        check_key(row.get("idempotency_key"))
        check_endpoint_name(row.get("endpoint"))
        payload_bytes(row.get("payload"))
        check_optional_text("recipient", row.get("recipient"), MAX_RECIPIENT_CHARS)
        check_optional_text("ordering_key", row.get("ordering_key"), MAX_ORDERING_KEY_CHARS)
        not_before = row.get("not_before")
        if isinstance(not_before, dt.datetime) and not_before.tzinfo is None:
            # Spark hands executors naive datetimes in the session time zone (UTC here).
            not_before = not_before.replace(tzinfo=dt.UTC)
        check_not_before(not_before)
    except InvalidEffect as exc:
        return str(exc)
    return None
