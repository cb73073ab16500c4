-- name: rejects_of_batch
-- A keyset page of one batch's rejects, newest first (ix_rejects_job_batch_id_id:
-- one range scan, no sort). A batch is bounded, so no time window is needed.
SELECT id, job, batch_id, run_id, reason, raw_row, rejected_at
FROM rejects
WHERE job = :job AND batch_id = :batch_id
  AND (CAST(:before_id AS bigint) IS NULL OR id < :before_id)
ORDER BY id DESC
LIMIT :limit;
