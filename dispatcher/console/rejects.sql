-- name: rejects_of_batch
-- A keyset page of one batch's rejects, newest first (ix_rejects_job_batch_id_id:
-- one range scan, no sort). A batch is bounded, so no time window is needed.
SELECT id, job, batch_id, run_id, reason, raw_row, rejected_at, requeued_at
FROM rejects
WHERE job = :job AND batch_id = :batch_id
  AND (CAST(:before_id AS bigint) IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;

-- name: requeueable_rejects
-- A batch's rejects refused only for naming an endpoint that was not registered
-- (their reason starts with :prefix), not requeued yet, oldest first; locked so
-- two requeues of one batch never enqueue a row twice. At most :limit rows.
SELECT id, reason, raw_row
FROM rejects
WHERE job = :job AND batch_id = :batch_id AND requeued_at IS NULL
  AND starts_with(reason, :prefix)
ORDER BY id
LIMIT :limit
FOR UPDATE;

-- name: mark_requeued
UPDATE rejects SET requeued_at = now() WHERE id = ANY(CAST(:ids AS bigint[]));

-- name: lock_batch_hold
-- The batch's marker, locked as a release or cancel locks it (holds.sql): a requeue
-- and a decision on the hold never interleave. No row: rejects of a batch that never
-- committed a marker (nothing to wait for).
SELECT run_id, hold_state FROM batches
WHERE job = :job AND batch_id = :batch_id
FOR UPDATE;

-- name: wait_with_held_batch
-- Requeued from a held batch: the new effects join the batch's run and are parked
-- at 'infinity' as the commit parks its own, so the claim skips them until a
-- release makes them due, and a cancel cancels them with the rest.
UPDATE effects
SET job = :job, batch_id = :batch_id, run_id = :run_id, next_attempt_at = 'infinity'
WHERE idempotency_key = ANY(CAST(:keys AS text[])) AND state = 'pending';
