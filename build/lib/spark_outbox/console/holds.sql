-- Held batches (the volume guard, spark_jobs/spark/guard.py): listed, released, cancelled.

-- name: held_batches
-- Every batch waiting for an operator, oldest first (ix_batches_run_id_held).
SELECT b.job, b.batch_id, b.committed_at, b.effects_new, b.hold_reason,
       (SELECT count(*) FROM effects e
        WHERE e.job = b.job AND e.batch_id = b.batch_id AND e.run_id = b.run_id
          AND e.state = 'pending') AS pending
FROM batches b
WHERE b.hold_state = 'held'
ORDER BY b.committed_at, b.id
LIMIT :limit;

-- name: lock_batch
-- The marker, locked: a release and a cancel of one batch never interleave.
SELECT run_id, hold_state FROM batches
WHERE job = :job AND batch_id = :batch_id
FOR UPDATE;

-- name: count_held_effects
-- The dry run: the batch's effects a release would let go, or a cancel stop
-- (ix_effects_job_batch_id_created_at_id).
SELECT count(*) FROM effects
WHERE job = :job AND batch_id = :batch_id AND run_id = :run_id AND state = 'pending';

-- name: resolve_hold
-- Released or cancelled: the claimable view no longer excludes the batch.
UPDATE batches SET hold_state = :hold_state, hold_resolved_at = now()
WHERE job = :job AND batch_id = :batch_id AND hold_state = 'held';

-- name: release_held_effects
-- Due at once: the commit parked them at 'infinity', out of the claim's index range.
UPDATE effects SET next_attempt_at = now(), updated_at = now()
WHERE job = :job AND batch_id = :batch_id AND run_id = :run_id AND state = 'pending'
  AND next_attempt_at = 'infinity';

-- name: cancel_held_effects
-- A cancelled batch delivers nothing; its rows stay, so its keys stay known
-- (a re-run deduplicates them, retention moves them to the key ledger).
UPDATE effects
SET state = 'cancelled', last_error = 'batch cancelled by an operator', updated_at = now()
WHERE job = :job AND batch_id = :batch_id AND run_id = :run_id AND state = 'pending';

-- name: held_effect_counts
-- /metrics: held batches and the effects they keep waiting (ix_batches_run_id_held).
SELECT count(*) AS batches, COALESCE(sum(effects_new), 0) AS effects
FROM batches WHERE hold_state = 'held';
