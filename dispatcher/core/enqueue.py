"""``enqueue``: write one effect inside the caller's own transaction.

For producers that are not Spark (a web app committing an order and its
"order.created" webhook together). Idempotent on the key. ``conn`` is a
SQLAlchemy ``Connection`` inside the caller's transaction (``engine.begin()``
on an engine from ``spark_outbox.core.db.create_engine``): README "Using it from your
own Python".

The payload contract per channel: a webhook takes any JSON object; an e-mail
takes exactly one address as ``recipient`` and a payload with ``subject``,
``text`` and optionally ``html`` (``validation.check_email_effect``, the same
check as the Spark sink's and the SMTP channel's).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine import Connection

from spark_outbox.core import tracing, wakeup
from spark_outbox.core.errors import ArchivedEndpoint, UnknownEndpoint
from spark_outbox.core.schema import VISIBILITY_LOCK_ID
from spark_outbox.core.sqlfile import queries_beside
from spark_outbox.core.validation import (
    MAX_ORDERING_KEY_CHARS,
    MAX_RECIPIENT_CHARS,
    check_email_effect,
    check_endpoint_name,
    check_expires_at,
    check_key,
    check_not_before,
    check_optional_text,
    check_reference,
    check_supersedes,
    payload_bytes,
    payload_sha256,
)

_Q = queries_beside(__file__, "enqueue.sql")
log = logging.getLogger("spark_outbox.enqueue")


@dataclasses.dataclass(frozen=True)
class Enqueued:
    idempotency_key: str
    new: bool
    # True when the key was already known with a different payload: the new
    # payload was NOT stored (the first one wins), and the caller should know.
    payload_mismatch: bool


def enqueue(
    conn: Connection,
    *,
    idempotency_key: str,
    endpoint: str,
    payload: Mapping[str, Any] | str,
    recipient: str | None = None,
    ordering_key: str | None = None,
    not_before: dt.datetime | None = None,
    reference: str | None = None,
    supersedes: str | None = None,
    expires_at: dt.datetime | None = None,
) -> Enqueued:
    """Record an effect in the caller's transaction; nothing is sent until it commits.

    Raises ``InvalidEffect`` (naming the field and the fix) before writing
    anything when the input breaks the contract. ``supersedes``: the key of the
    effect this one corrects (``spark_outbox.core.keys.superseded_key``).
    ``expires_at``: the send-by time; after it the effect is never sent and ends
    'expired' (one already past is recorded and expires at once).
    """
    idempotency_key = check_key(idempotency_key)
    endpoint = check_endpoint_name(endpoint)
    data = payload_bytes(payload)
    recipient = check_optional_text("recipient", recipient, MAX_RECIPIENT_CHARS)
    ordering_key = check_optional_text("ordering_key", ordering_key, MAX_ORDERING_KEY_CHARS)
    not_before = check_not_before(not_before)
    expires_at = check_expires_at(expires_at, not_before)
    reference = check_reference(reference)
    supersedes = check_supersedes(supersedes, idempotency_key)
    found = conn.execute(_Q["endpoint_kind"], {"endpoint": endpoint}).first()
    if found is None:
        raise UnknownEndpoint(endpoint)
    kind, archived = found
    if archived:
        raise ArchivedEndpoint(endpoint)
    if kind == "email":
        recipient = check_email_effect(recipient, json.loads(data))
    digest = payload_sha256(data)
    row = {
        "idempotency_key": idempotency_key,
        "endpoint": endpoint,
        "recipient": recipient,
        "payload": data.decode("utf-8"),
        "payload_sha256": digest,
        "ordering_key": ordering_key,
        "not_before": not_before,
        "reference": reference,
        "supersedes": supersedes,
        "expires_at": expires_at,
    }
    with tracing.span("outbox.enqueue", _span_attributes(idempotency_key, endpoint)) as span:
        # The effect keeps the trace it was created in: its sends join it.
        created_in = tracing.carrier(span) if span is not None else tracing.current()
        row["trace_parent"] = created_in.traceparent if created_in else None
        row["trace_state"] = created_in.tracestate if created_in else None
        enqueued = _write(conn, row)
        if span is not None:
            span.set_attribute("outbox.new", enqueued.new)
        return enqueued


def _write(conn: Connection, row: Mapping[str, Any]) -> Enqueued:
    """Insert (or take over an invisible row); else learn whether the payload differs."""
    key = row["idempotency_key"]
    inserted = conn.execute(_Q["insert_effect"], row).first() or _take_over_invisible(conn, row)
    if inserted is not None:
        wakeup.notify(conn, "enqueued")
        return Enqueued(idempotency_key=key, new=True, payload_mismatch=False)
    stored = conn.execute(_Q["stored_payload_sha256"], {"idempotency_key": key}).scalar()
    digest = row["payload_sha256"]
    mismatch = stored is not None and stored != digest
    if stored is not None and mismatch:
        _record_mismatch(conn, key, row["endpoint"], str(stored), digest)
    return Enqueued(idempotency_key=key, new=False, payload_mismatch=mismatch)


def _span_attributes(key: str, endpoint: str) -> dict[str, Any]:
    return {"outbox.idempotency_key": key, "outbox.endpoint": endpoint}


def _record_mismatch(conn: Connection, key: str, endpoint: str, stored: str, offered: str) -> None:
    """Counted where operators look (status, metrics) and said in the log: the
    producer computed other content for a key it already enqueued."""
    params = {
        "idempotency_key": key,
        "endpoint": endpoint,
        "stored_sha256": stored,
        "offered_sha256": offered,
    }
    conn.execute(_Q["record_mismatch"], params)
    log.warning(
        "payload mismatch: key %s for endpoint %s was enqueued before with another payload; "
        "the first payload stays (a new payload needs a new key, or a correction: supersedes)",
        key,
        endpoint,
    )


def _take_over_invisible(conn: Connection, row: Mapping[str, Any]) -> Any:
    """The key is taken: by a visible effect (None: deduplicated), or by a row of
    a run without a marker, which this effect takes over (the sink's trap)."""
    if conn.execute(_Q["held_by_invisible"], row).first() is None:
        return None  # visible rows stay visible: no lock needed to know
    conn.execute(_Q["take_visibility_lock"], {"lock_id": VISIBILITY_LOCK_ID})
    return conn.execute(_Q["take_over_invisible"], row).first()
