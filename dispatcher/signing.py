"""Standard Webhooks v1 signatures, so any Standard Webhooks library can verify us.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}`` over exactly
the bytes sent; ``webhook-id`` is the effect's idempotency key, so a receiver
deduplicates on it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """Every header a signed delivery carries (content type and user agent included)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "spark-outbox-dispatcher/0.1",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, msg_id, timestamp, body),
        "Idempotency-Key": msg_id,
    }
