-- The volume guard's statements (spark_jobs/guard.py).

-- name: baseline
-- The median of an endpoint's new effects over the job's last :window batches
-- that count (not held, not cancelled; markers from before 1321 have no counts);
-- a batch without effects for the endpoint counts 0. ix_batches_job_committed_at.
SELECT count(*) AS batches,
       percentile_cont(0.5) WITHIN GROUP (
           ORDER BY COALESCE(CAST(r.effects_new_by_endpoint ->> :endpoint AS bigint), 0)
       ) AS median
FROM (
    SELECT effects_new_by_endpoint FROM batches
    WHERE job = :job AND effects_new_by_endpoint IS NOT NULL
      AND hold_state IS DISTINCT FROM 'held' AND hold_state IS DISTINCT FROM 'cancelled'
    ORDER BY committed_at DESC
    LIMIT :window
) r;
