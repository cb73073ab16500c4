-- The volume guard's statements (spark_jobs/spark/guard.py).

-- name: baseline
-- The median of an endpoint's new effects over the job's last :window batches
-- that gave it any (a stream's empty micro-batches would make the median 0 and
-- hold every real one), held and cancelled batches left out; markers from
-- before 1321 have no counts. Newest first on ix_batches_job_committed_at.
SELECT count(*) AS batches, percentile_cont(0.5) WITHIN GROUP (ORDER BY r.n) AS median
FROM (
    SELECT CAST(effects_new_by_endpoint ->> :endpoint AS bigint) AS n FROM batches
    WHERE job = :job
      AND CAST(effects_new_by_endpoint ->> :endpoint AS bigint) > 0
      AND hold_state IS DISTINCT FROM 'held' AND hold_state IS DISTINCT FROM 'cancelled'
    ORDER BY committed_at DESC
    LIMIT :window
) r;
