"""The effect column contract, checked the same way for every producer.

``enqueue`` raises on the first problem; the Spark sink turns the same
problems into per-row reject reasons. The standard library and orjson only:
executors use it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import orjson

from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.keys import is_valid_key

MAX_PAYLOAD_BYTES = 256 * 1024
# json.dumps writes U+0000 as the escape \u0000 (after an even run of backslashes).
_NUL_ESCAPE = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
# One encoder, built once: json.dumps with these options would build one per call.
# It DEFINES the canonical payload bytes (and so payload_sha256): docs/design.md.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)
# Where orjson may print a number unlike _CANONICAL (Python's repr): with an exponent
# (Python writes 1e-05, orjson 1e-5; an integer beyond 64 bits becomes an orjson
# float of magnitude >= 9.2e18, printed 9.2...e+18) or a fixed-point float below
# 1e-4 (orjson 0.00005, Python 5e-05). Such payloads take the exact path.
# With the NUL escape (which the exact path refuses), the one screen of orjson's
# bytes: the payloads it matches take the exact path. A pattern both Python's re
# and RE2 (Arrow's regex kernels, spark_outbox.spark.checks) read the same way.
FAST_PATH_SCREEN = r"\\u0000|[0-9]e[-+]|0\.0000"
_SCREEN = re.compile(FAST_PATH_SCREEN.encode())
MAX_RECIPIENT_CHARS = 1024
MAX_ORDERING_KEY_CHARS = 512
MAX_REFERENCE_CHARS = 200


def check_key(key: object) -> str:
    if not is_valid_key(key):
        raise InvalidEffect(
            "idempotency_key",
            f"{_preview(key)} is not 64 lower-case hex characters",
            "derive it with spark_outbox.core.keys.effect_key(namespace, *business_fields) "
            "(in Spark: spark_outbox.spark.keys.effect_key_column)",
        )
    assert isinstance(key, str)
    return key


def check_supersedes(key: object, own_key: object = None) -> str | None:
    """A correction names the key it supersedes: 64 hex, not its own."""
    if key is None:
        return None
    if not is_valid_key(key):
        raise InvalidEffect(
            "supersedes",
            f"{_preview(key)} is not 64 lower-case hex characters",
            "name the corrected effect's key: "
            "spark_outbox.core.keys.superseded_key(..., revision=n) "
            "(in Spark: spark_outbox.spark.keys.supersedes_column)",
        )
    if key == own_key:
        raise InvalidEffect("supersedes", "is the effect's own key", "raise the revision")
    assert isinstance(key, str)
    return key


def check_endpoint_name(endpoint: object) -> str:
    if not isinstance(endpoint, str) or not endpoint.strip():
        raise InvalidEffect(
            "endpoint", "is missing", "name a registered endpoint, e.g. 'billing-webhook'"
        )
    return endpoint


def payload_bytes(payload: object) -> bytes:
    """Canonical JSON bytes of an object payload (a dict, or a JSON object as text).

    Text goes through orjson first (~4x faster: the sink canonicalises every row),
    which gives exactly ``_CANONICAL``'s bytes (a property test proves it over
    arbitrary JSON) unless ``_fast_canonical`` hands the text to the exact path.
    """
    if isinstance(payload, str):
        data = _fast_canonical(payload)
        if data is not None:
            return data
    return _exact_canonical(payload)


def _fast_canonical(text: str) -> bytes | None:
    """orjson's canonical bytes, or None where they might differ from ``_CANONICAL``'s
    or where the exact path would refuse the payload (it then says why)."""
    data = unscreened_canonical(text)
    if data is None or len(data) > MAX_PAYLOAD_BYTES:
        return None
    # The substring tests first: the regex costs ~20x more and is rarely needed.
    if (b"e-" in data or b"e+" in data or b"0.0000" in data or b"\\u0000" in data) and (
        _SCREEN.search(data)
    ):
        return None
    return data


def unscreened_canonical(text: object) -> bytes | None:
    """orjson's sorted, compact bytes of a JSON object as text, None if it is not
    one. Canonical only once ``FAST_PATH_SCREEN`` does not match them and they are
    at most MAX_PAYLOAD_BYTES (``payload_bytes``, or the same screen over a column)."""
    if type(text) is not str:
        return None
    try:
        value = orjson.loads(text)
        if type(value) is not dict:
            return None
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (ValueError, TypeError):  # orjson's decode and encode errors
        return None


def _exact_canonical(payload: object) -> bytes:
    if isinstance(payload, str | bytes):
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise InvalidEffect(
                "payload", f"is not valid JSON ({exc})", "pass a dict or a JSON object as text"
            ) from exc
        except RecursionError as exc:
            raise _too_deep() from exc
    if not isinstance(payload, dict | Mapping):  # dict first: the ABC check is slow
        raise InvalidEffect(
            "payload",
            f"is a JSON {type(payload).__name__}, not an object",
            'wrap the value in an object, e.g. {"value": ...}',
        )
    try:
        data = _CANONICAL.encode(payload).encode("utf-8")
    except RecursionError as exc:
        raise _too_deep() from exc
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


def _too_deep() -> InvalidEffect:
    return InvalidEffect(
        "payload", "is nested too deeply to encode", "flatten it (a few levels are plenty)"
    )


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


def check_reference(value: object) -> str | None:
    """A business reference (an invoice number): optional, short, NUL-free text."""
    reference = check_optional_text("reference", value, MAX_REFERENCE_CHARS)
    if reference is not None and "\x00" in reference:
        raise InvalidEffect(
            "reference", "contains a NUL character", "remove it; PostgreSQL text cannot hold NUL"
        )
    return reference


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


def check_expires_at(value: object, not_before: dt.datetime | None = None) -> dt.datetime | None:
    """The send-by time: an aware datetime, after ``not_before`` when both are given
    (else the effect could never be sent). One already past is accepted: the effect
    is recorded and ends 'expired', never sent (docs/design.md, "Send-by times"):
    whether a send is still worth making is decided against the database's clock,
    when the dispatcher gets to it, not against the producer's at enqueue."""
    if value is None:
        return None
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        raise InvalidEffect(
            "expires_at",
            f"{_preview(value)} is not an aware datetime",
            "pass a timezone-aware datetime, e.g. "
            "datetime.now(datetime.UTC) + datetime.timedelta(minutes=15)",
        )
    if not_before is not None and value <= not_before:
        raise InvalidEffect(
            "expires_at",
            f"{value.isoformat()} is not after not_before {not_before.isoformat()}: "
            "the effect could never be sent",
            "give a send-by time after not_before, or leave one of them out",
        )
    return value


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# The e-mail contract: what an effect on an e-mail endpoint must carry. Checked
# when it is enqueued (enqueue, the Spark sink) and again when it is rendered
# (the SMTP channel), with the same reasons.
MAX_SUBJECT_CHARS = 998  # RFC 5322's line limit
# One address, the common addr-spec: local@domain, no display name, no list, no
# comments, no whitespace or control characters anywhere.
# (fullmatch and \Z, never $: $ also matches before a trailing newline.)
_ADDRESS = re.compile(
    r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~.-]{1,64}@"
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+"
)
_HEADER_BREAKING = re.compile(r"[\x00-\x1f\x7f\u2028\u2029\x85]")


def check_recipient_address(recipient: object) -> str:
    """Exactly one plain address (``name@example.com``); anything else is refused."""
    if recipient is None or (isinstance(recipient, str) and not recipient.strip()):
        raise InvalidEffect(
            "recipient", "is missing", "e-mail effects need one address, e.g. 'ada@example.com'"
        )
    if not isinstance(recipient, str) or not _ADDRESS.fullmatch(recipient):
        raise InvalidEffect(
            "recipient",
            f"{_preview(recipient)} is not exactly one e-mail address",
            "give one plain address like 'ada@example.com' (no name, list, spaces or "
            "control characters); one effect per recipient",
        )
    return recipient


def check_email_payload(payload: Mapping[str, Any]) -> None:
    """``subject`` (one line of text), ``text`` (the body), optional ``html``."""
    subject = payload.get("subject")
    if not isinstance(subject, str) or not subject.strip():
        raise InvalidEffect(
            "payload.subject", "is missing or empty", 'e-mail payloads need {"subject": "..."}'
        )
    if _HEADER_BREAKING.search(subject) or len(subject) > MAX_SUBJECT_CHARS:
        raise InvalidEffect(
            "payload.subject",
            f"{_preview(subject)} is not one line of at most {MAX_SUBJECT_CHARS} characters",
            "remove line breaks and control characters; shorten it",
        )
    if not isinstance(payload.get("text"), str):
        raise InvalidEffect(
            "payload.text", "is missing or not a string", 'e-mail payloads need {"text": "..."}'
        )
    html = payload.get("html")
    if html is not None and not isinstance(html, str):
        raise InvalidEffect(
            "payload.html", f"is a {type(html).__name__}", "pass a string or leave it out"
        )


def check_email_effect(recipient: object, payload: Mapping[str, Any]) -> str:
    """The whole e-mail contract; returns the recipient. Raises ``InvalidEffect``."""
    address = check_recipient_address(recipient)
    check_email_payload(payload)
    return address
