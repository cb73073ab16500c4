"""The body every contender POSTs: a ~230-byte JSON object (an invoice-like event)."""

from __future__ import annotations

import json

PAD = "x" * 160


def document(n: int) -> dict[str, object]:
    return {"type": "invoice.created", "n": n, "currency": "EUR", "pad": PAD}


def body(n: int) -> bytes:
    return json.dumps(document(n)).encode()
