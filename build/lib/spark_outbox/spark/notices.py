"""What a committed batch tells the people running the job, at WARNING: that the
volume guard held it, and which stored keys it met with another payload (by
key only, never a payload: a payload is customer data)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)
MISMATCH_KEYS_LOGGED = 10


def batch_committed(
    job: str, batch_id: str, held: str | None, mismatches: int, keys: list[str]
) -> None:
    fields = {"job": job, "batch_id": batch_id}
    if held is not None:
        log.warning(
            "batch held by the volume guard: %s", held,
            extra={"event": "batch.held", "reason": held, **fields},
        )  # fmt: skip
    shown = sorted(set(keys))[:MISMATCH_KEYS_LOGGED]
    for key in shown:
        log.warning(
            "payload mismatch: key %s was stored with another payload, which was kept; "
            "send a correction (a revision) if the content changed",
            key,
            extra={"event": "batch.payload_mismatch", "idempotency_key": key, **fields},
        )
    if mismatches > len(shown):
        log.warning(
            "payload mismatches: %d more key(s) not listed", mismatches - len(shown),
            extra={"event": "batch.payload_mismatch", "mismatches": mismatches, **fields},
        )  # fmt: skip
