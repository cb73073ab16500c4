"""The effect column contract, checked the same way for every producer.

``enqueue`` raises on the first problem; the Spark sink turns the same
problems into per-row reject reasons. Standard library only: executors use it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from dispatcher.errors import InvalidEffect
from dispatcher.keys import is_valid_key

MAX_PAYLOAD_BYTES = 256 * 1024
# json.dumps writes U+0000 as the escape \u0000 (after an even run of backslashes).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# One encoder, built once: json.dumps with these options would build one per call.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
MAX_RECIPIENT_CHARS = 1024
MAX_ORDERING_KEY_CHARS = 512


def check_key(key: object) -> str:
    if not is_valid_key(key):
        raise InvalidEffect(
            "idempotency_key",
            f"{_preview(key)} is not 64 lower-case hex characters",
            "derive it with dispatcher.keys.effect_key(namespace, *business_fields) "
            "(in Spark: spark_jobs.keys.effect_key_column)",
        )
    assert isinstance(key, str)
    return key


def check_endpoint_name(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise InvalidEffect(
            "endpoint", "is missing", "name a registered endpoint, e.g. 'billing-webhook'"
        )
    return endpoint


def payload_bytes(payload: object) -> bytes:
    """Canonical JSON bytes of an object payload (a dict, or a JSON object as text)."""
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise InvalidEffect(
                "payload", f"is not valid JSON ({exc})", "pass a dict or a JSON object as text"
            ) from exc
    if not isinstance(payload, dict | Mapping):  # dict first: the ABC check is slow
        raise InvalidEffect(
            "payload",
            f"is a JSON {type(payload).__name__}, not an object",
            'wrap the value in an object, e.g. {"value": ...}',
        )
    try:
        data = _CANONICAL.encode(payload).encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise InvalidEffect(
            "payload",
            f"cannot be encoded as JSON ({exc})",
            "use only str, numbers, bools, None, lists and dicts",
        ) from exc
    if len(data) > MAX_PAYLOAD_BYTES:
        raise InvalidEffect(
            "payload",
            f"is {len(data)} bytes, over the {MAX_PAYLOAD_BYTES}-byte limit",
            "send a reference (an id or URL) instead of the document itself",
        )
    # The substring test first: the regex is ~60x slower and almost never needed.
    if b"\\u0000" in data and _NUL_ESCAPE.search(data):
        raise InvalidEffect(
            "payload",
            "contains a NUL character (\\u0000), which jsonb refuses",
            "remove or replace NUL characters",
        )
    return data


def payload_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_optional_text(field: str, value: object, max_chars: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidEffect(field, f"is a {type(value).__name__}", "pass a string or None")
    if len(value) > max_chars:
        raise InvalidEffect(
            field,
            f"is {len(value)} characters, over {max_chars}",
            f"shorten it to at most {max_chars} characters",
        )
    return value


def check_not_before(value: object) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise InvalidEffect(
            "not_before",
            f"{_preview(value)} is not an aware datetime",
            "pass a timezone-aware datetime, e.g. datetime.now(datetime.UTC)",
        )
    return value


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
