"""Standard Webhooks v1 signatures, so any Standard Webhooks library can verify us.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}`` over exactly
the bytes sent; ``webhook-id`` is the effect's idempotency key, so a receiver
deduplicates on it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def signature(secret: bytes, idempotency_key: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256>``."""
    signed = f"{idempotency_key}.{timestamp}.".encode() + body
    digest = hmac.digest(secret, signed, hashlib.sha256)  # one-shot C path
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(secret: bytes, idempotency_key: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header a signed delivery carries (content type and user agent included)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "spark-outbox-dispatcher/0.1",
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secret, idempotency_key, timestamp, body),
        "Idempotency-Key": idempotency_key,
    }
