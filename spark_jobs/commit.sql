-- Every statement that reads staging takes :chunk: NULL for all chunks of the
-- given Spark tasks (the sequential merge), or the one chunk being merged.

-- name: read_marker
-- The replay check, and how an unknown COMMIT outcome is resolved: the marker says.
SELECT run_id, result_rows, effects_total, effects_new, effects_deduplicated,
       payload_mismatches, rejects
FROM batches WHERE job = :job AND batch_id = :batch_id;

-- name: begin_run
-- Registers the run before it stages anything, so its rows can be swept if it dies.
INSERT INTO batch_runs (run_id, job, batch_id) VALUES (:run_id, :job, :batch_id);

-- name: abandoned_runs
-- Runs whose batch another run committed, or that are older than the grace period.
SELECT a.run_id FROM batch_runs a
WHERE a.started_at < now() - make_interval(secs => :grace_s)
   OR EXISTS (SELECT 1 FROM batches b WHERE b.job = a.job AND b.batch_id = a.batch_id);

-- name: delete_staged_effects
DELETE FROM staged_effects WHERE run_id = ANY(CAST(:run_ids AS uuid[]));

-- name: delete_staged_results
DELETE FROM staged_results WHERE run_id = ANY(CAST(:run_ids AS uuid[]));

-- name: delete_staged_chunks
DELETE FROM staged_chunks WHERE run_id = ANY(CAST(:run_ids AS uuid[]));

-- name: staged_chunks
-- The chunks executors have committed so far; the commit merges each once.
SELECT kind, task_id, chunk, rows FROM staged_chunks WHERE run_id = :run_id;

-- name: delete_runs
DELETE FROM batch_runs WHERE run_id = ANY(CAST(:run_ids AS uuid[]));

-- name: insert_marker
-- The fence: first in the transaction, so a racing run waits on the unique
-- index and then finds the conflict; nothing is returned when another run won.
INSERT INTO batches (job, batch_id, run_id, spark_app_id)
VALUES (:job, :batch_id, :run_id, :spark_app_id)
ON CONFLICT (job, batch_id) DO NOTHING
RETURNING id;

-- name: first_reject_reasons
-- For on_invalid="fail": what to tell the person who wrote the job.
SELECT COALESCE(s.reject_reason,
                format('endpoint: no endpoint named %L is registered; register it first '
                       'with `outbox endpoints add` or fix the name', s.endpoint)) AS reason
FROM staged_effects s
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
  AND (CAST(:chunk AS integer) IS NULL OR s.chunk = :chunk)
  AND (s.reject_reason IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.name = s.endpoint))
LIMIT :limit;

-- name: move_rejects
-- Rows that broke the contract (reason set by the executor) or name an unknown
-- endpoint: kept with their reason in the same commit, never dropped.
INSERT INTO rejects (job, batch_id, run_id, reason, raw_row)
SELECT :job, :batch_id, s.run_id,
       COALESCE(s.reject_reason,
                format('endpoint: no endpoint named %L is registered; register it first '
                       'with `outbox endpoints add` or fix the name', s.endpoint)),
       COALESCE(CAST(s.raw_row AS jsonb),
                jsonb_build_object('idempotency_key', s.idempotency_key, 'endpoint', s.endpoint,
                                   'recipient', s.recipient, 'payload', s.payload,
                                   'ordering_key', s.ordering_key, 'not_before', s.not_before))
FROM staged_effects s
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
  AND (CAST(:chunk AS integer) IS NULL OR s.chunk = :chunk)
  AND (s.reject_reason IS NOT NULL
       OR NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.name = s.endpoint));

-- name: insert_effects
-- The set-based merge: valid rows of the successful Spark tasks, first writer
-- wins; a key already delivered and purged (key_ledger) is never enqueued again.
-- No ORDER BY: a million staged rows overflow work_mem and the sort spills to
-- disk; measured at 1M rows, the sorted merge was ~4.5 s slower, not faster.
WITH valid AS (
    SELECT s.* FROM staged_effects s
    WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
      AND (CAST(:chunk AS integer) IS NULL OR s.chunk = :chunk)
      AND s.reject_reason IS NULL
      AND EXISTS (SELECT 1 FROM endpoints e WHERE e.name = s.endpoint)
), inserted AS (
    INSERT INTO effects (idempotency_key, job, batch_id, endpoint, recipient, payload,
                         payload_sha256, ordering_key, next_attempt_at)
    SELECT v.idempotency_key, :job, :batch_id, v.endpoint, v.recipient,
           v.payload, v.payload_sha256, v.ordering_key,
           COALESCE(v.not_before, now())
    FROM valid v
    WHERE NOT EXISTS (SELECT 1 FROM key_ledger l WHERE l.idempotency_key = v.idempotency_key)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM valid) AS total, (SELECT count(*) FROM inserted) AS new;

-- name: count_payload_mismatches
-- Run only when some rows were deduplicated. After the insert, a staged row whose
-- key is stored with another hash (earlier batch, enqueue(), the ledger, or a
-- twin in this batch) is a mismatch: the stored payload won, this one was not kept.
SELECT count(*) FROM staged_effects s
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
  AND (CAST(:chunk AS integer) IS NULL OR s.chunk = :chunk) AND s.reject_reason IS NULL
  AND (EXISTS (SELECT 1 FROM effects e WHERE e.idempotency_key = s.idempotency_key
                                         AND e.payload_sha256 <> s.payload_sha256)
       OR EXISTS (SELECT 1 FROM key_ledger l WHERE l.idempotency_key = s.idempotency_key
                                              AND l.payload_sha256 <> s.payload_sha256
                                              AND NOT EXISTS (SELECT 1 FROM effects e
                                                  WHERE e.idempotency_key = s.idempotency_key)));

-- name: count_staged
-- Fences the abandoned-run sweeper: the merge must see every row the driver
-- knows its tasks staged, or it rolls back.
SELECT (SELECT count(*) FROM staged_effects
        WHERE run_id = :run_id AND task_id = ANY(:task_ids)) AS effects,
       (SELECT count(*) FROM staged_results
        WHERE run_id = :run_id AND task_id = ANY(:task_ids)) AS results;

-- name: results_columns
-- The results table's columns: result rows are applied by name, so names are checked.
SELECT attname FROM pg_attribute
WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped;

-- name: apply_results_template
-- Template (identifiers quoted by the driver after checking them against the
-- catalog): works for any results table, rows applied with jsonb_populate_record.
INSERT INTO {table} ({columns})
SELECT {record_columns}
FROM staged_results s CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, s.row) r
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
  AND (CAST(:chunk AS integer) IS NULL OR s.chunk = :chunk)
ON CONFLICT ({conflict_keys}) DO UPDATE SET {assignments};

-- name: finish_marker
UPDATE batches
SET result_rows = :result_rows, effects_total = :effects_total, effects_new = :effects_new,
    effects_deduplicated = :effects_deduplicated, payload_mismatches = :payload_mismatches,
    rejects = :rejects, duration_s = :duration_s
WHERE job = :job AND batch_id = :batch_id;
