"""What a batch write reports, and how it fails."""

from __future__ import annotations

import dataclasses

from spark_outbox.core.errors import OutboxError


class BatchNotCommitted(OutboxError):
    """The batch was not committed; nothing of it is visible. Re-running it is safe."""


class BatchInterrupted(BatchNotCommitted):
    """The database went away mid-write (a restart; a crash, which empties the UNLOGGED
    staging): nothing committed. The sink waits for it and writes the batch again."""


class InvalidRows(BatchNotCommitted):
    """on_invalid="fail" and some rows broke the contract."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchCounts:
    result_rows: int = 0
    effects_total: int = 0  # valid effect rows the batch carried
    effects_new: int = 0  # of them, enqueued by this batch
    effects_deduplicated: int = 0  # of them, already enqueued (or delivered) before
    payload_mismatches: int = 0  # of the deduplicated, stored with another payload
    rejects: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Marker(BatchCounts):
    """A committed batch's marker: the run that committed it and its counts."""

    run_id: str
    hold_reason: str | None = None  # the volume guard held it (spark_outbox.spark.guard)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BatchOutcome(BatchCounts):
    """What this call did. ``status``: committed (by this run); replayed (a marker
    existed before we started: nothing written, counts zero, the marker's in
    ``original``); lost_race (another run committed the batch meanwhile). A
    committed batch the volume guard held has ``held_reason``."""

    job: str
    batch_id: str
    status: str
    run_id: str | None
    resolved_by_marker: bool = False
    original: Marker | None = None
    # The volume guard held the batch (committed, not claimable): why. None: it flows.
    held_reason: str | None = None
