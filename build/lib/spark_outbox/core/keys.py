"""Deterministic idempotency keys derived from business identity.

An effect's key must be the same every time the same business fact is seen
(a replayed batch, a re-run job, a retried task), and different for any two
different facts. So the key is SHA-256 over an *unambiguous* encoding of
``(namespace, *parts)``:

    "v1" "|" <part> "|" <part> ...

where every part is a one-letter type tag followed by a body that can never
contain the separator ``|``:

==========  ===  ===============================================================
type        tag  body
==========  ===  ===============================================================
None        N    (empty)
str         s    upper-case hex of the UTF-8 bytes
bool        b    ``1`` or ``0``
int         i    decimal digits, ``-`` for negatives
Decimal     n    plain (no exponent) digits of the normalised value
float       f    ``float.hex()``: exact, distinguishes ``-0.0`` and ``0.0``
bytes       x    upper-case hex
date        d    days since 1970-01-01
datetime    t    microseconds since the Unix epoch, UTC (timezone required)
==========  ===  ===============================================================

**Revisions** (corrections, docs/spark.md): ``effect_key(ns, *parts,
revision=n)`` for n >= 2 appends ``"|r" <n>``; ``r`` is no part's tag, so a
revision never collides with another part list, and revision 1 is the original
key unchanged. ``superseded_key`` names the revision a correction replaces.

Tags keep ``1``, ``"1"``, ``1.0`` and ``Decimal("1")`` apart; hex keeps a
separator inside a string from forging a boundary; ``None`` is not ``""``.
The same encoding is built from Spark's built-in functions in
``spark_outbox.spark.keys``; a property test proves the two agree byte for byte.

This module is imported on Spark executors: standard library only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from decimal import Decimal
from typing import TypeAlias

KEY_VERSION = "v1"
SEPARATOR = "|"
REVISION_TAG = "r"
KEY_PATTERN = re.compile(r"\A[0-9a-f]{64}\Z")

KeyPart: TypeAlias = str | int | bool | float | Decimal | bytes | dt.date | dt.datetime | None

_EPOCH_DATE = dt.date(1970, 1, 1)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_MICROSECOND = dt.timedelta(microseconds=1)


def effect_key(namespace: str, *parts: KeyPart, revision: int = 1) -> str:
    """Return the 64-hex-character idempotency key of ``(namespace, *parts)``.

    ``namespace`` names the kind of effect (``"invoice.created"``) so that two
    kinds of effect about the same business object get different keys.
    ``revision`` > 1: a correction of the same business event, a new key.
    """
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("namespace: must be a non-empty string, e.g. 'invoice.created'")
    encoded = encode_parts(namespace, *parts, revision=revision)
    return hashlib.sha256(encoded.encode("ascii")).hexdigest()


def superseded_key(namespace: str, *parts: KeyPart, revision: int) -> str | None:
    """The key a revision replaces (``revision - 1``); None for the original."""
    check_revision(revision)
    return None if revision == 1 else effect_key(namespace, *parts, revision=revision - 1)


def encode_parts(namespace: str, *parts: KeyPart, revision: int = 1) -> str:
    """The exact ASCII string that is hashed (exposed for tests and debugging)."""
    encoded = [KEY_VERSION, encode_part(namespace)]
    encoded.extend(encode_part(part) for part in parts)
    if check_revision(revision) > 1:
        encoded.append(f"{REVISION_TAG}{revision:d}")
    return SEPARATOR.join(encoded)


def check_revision(revision: object) -> int:
    if isinstance(revision, bool) or not isinstance(revision, int) or revision < 1:
        raise ValueError(f"revision: {revision!r} is not a whole number >= 1; the original is 1")
    return revision


def encode_part(value: KeyPart) -> str:
    """Encode one value as ``<tag><body>``; see the module docstring."""
    # bool before int: bool is a subclass of int. datetime before date: likewise.
    if value is None:
        return "N"
    if isinstance(value, str):
        return "s" + value.encode("utf-8").hex().upper()
    if isinstance(value, bool):
        return "b1" if value else "b0"
    if isinstance(value, int):
        return f"i{value:d}"
    if isinstance(value, Decimal):
        return "n" + _plain_decimal(value)
    if isinstance(value, float):
        return "f" + value.hex()
    if isinstance(value, bytes | bytearray | memoryview):
        return "x" + bytes(value).hex().upper()
    if isinstance(value, dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                "timestamp key part has no time zone: pass an aware datetime "
                "(e.g. value.replace(tzinfo=datetime.UTC)) so it means one instant"
            )
        return f"t{(value - _EPOCH) // _ONE_MICROSECOND:d}"
    if isinstance(value, dt.date):
        return f"d{(value - _EPOCH_DATE).days:d}"
    raise TypeError(
        f"key part of type {type(value).__name__} is not supported: convert it to "
        "str, int, Decimal, bool, bytes, date or an aware datetime"
    )


def _plain_decimal(value: Decimal) -> str:
    """Digits of the normalised value with no exponent: 1.10 -> "1.1", -0 -> "0"."""
    if not value.is_finite():
        raise ValueError(f"decimal key part {value} is not finite: NaN and Infinity name no fact")
    if value.is_zero():
        return "0"
    # format(value, "f") is exact; normalize() would round to the context's 28 digits
    # and make decimal(38, s) values that differ beyond the 28th digit collide.
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def is_valid_key(key: object) -> bool:
    """True for 64 lower-case hex characters (what ``effect_key`` returns)."""
    return isinstance(key, str) and KEY_PATTERN.match(key) is not None
