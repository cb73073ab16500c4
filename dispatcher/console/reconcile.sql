-- name: batch_marker
-- The marker, with where its result rows went (migration 2721).
SELECT id, job, batch_id, run_id, result_rows, results_table, result_keys, result_columns,
       result_stamp
FROM batches WHERE job = :job AND batch_id = :batch_id;

-- name: batch_effects_by_category
-- A batch's effect rows (ix_effects_job_batch_id_created_at_id) by state, purged
-- rows apart, and whether its run wrote them ("own": the marker's run, or no run
-- for rows written before run ids existed): a foreign row (another run's, visible
-- through its own marker) never makes up for a missing one. "unrecorded" counts
-- delivered rows with neither a delivered attempt nor a delivered ledger row (the
-- record statement writes both, so none should be).
SELECT CASE WHEN e.purged_at IS NOT NULL THEN 'purged'
            -- pending in a batch the volume guard holds: waiting for an operator
            WHEN e.state = 'pending' AND EXISTS (
                SELECT 1 FROM batches b
                WHERE b.job = e.job AND b.batch_id = e.batch_id AND b.hold_state = 'held')
            THEN 'held'
            ELSE e.state END AS state,
       (e.run_id IS NULL OR e.run_id = CAST(:run_id AS uuid)) AS own,
       count(*) AS n,
       count(*) FILTER (
           WHERE e.state = 'delivered' AND e.purged_at IS NULL
             AND NOT EXISTS (SELECT 1 FROM delivery_attempts a
                             WHERE a.effect_id = e.id AND a.outcome = 'delivered')
             AND NOT EXISTS (SELECT 1 FROM key_ledger k
                             WHERE k.idempotency_key = e.idempotency_key
                               AND k.state = 'delivered')
       ) AS unrecorded,
       COALESCE(sum(e.attempt_count), 0) AS attempts
FROM visible_effects e
WHERE e.job = :job AND e.batch_id = :batch_id
GROUP BY 1, 2;

-- name: foreign_effects
-- The batch's foreign effect rows, named (the first :limit by key).
SELECT e.idempotency_key FROM visible_effects e
WHERE e.job = :job AND e.batch_id = :batch_id
  AND e.run_id IS NOT NULL AND e.run_id <> CAST(:run_id AS uuid)
ORDER BY e.idempotency_key
LIMIT :limit;
