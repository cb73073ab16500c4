"""Standard Webhooks v1 signatures, so any Standard Webhooks library can verify us.

The signed content is ``{webhook-id}.{webhook-timestamp}.{body}`` over exactly
the bytes sent; ``webhook-id`` is the effect's idempotency key, so a receiver
deduplicates on it. During a secret rotation's overlap a delivery is signed with
each active secret: the header carries several space-separated ``v1,<sig>``
(Standard Webhooks allows it), and a receiver holding either secret accepts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence


def signature(secrets: Sequence[bytes], idempotency_key: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256>`` per secret."""
    signed = f"{idempotency_key}.{timestamp}.".encode() + body
    # hmac.digest: the one-shot C path (measured: cheaper than hmac.new(...).digest()).
    return " ".join(
        "v1," + base64.b64encode(hmac.digest(s, signed, hashlib.sha256)).decode("ascii")
        for s in secrets
    )


def headers(
    secrets: Sequence[bytes], idempotency_key: str, timestamp: int, body: bytes
) -> dict[str, str]:
    """Every header a signed delivery carries (content type and user agent included)."""
    return {
        "Content-Type": "application/json",
        "User-Agent": "spark-outbox-dispatcher/0.1",
        "webhook-id": idempotency_key,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(secrets, idempotency_key, timestamp, body),
        "Idempotency-Key": idempotency_key,
    }
