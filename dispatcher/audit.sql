-- name: effect_by_key
-- One effect by its key (uq_effects_idempotency_key); only a visible one (a row of
-- a run that has not committed does not exist yet, for support as for the dispatcher).
SELECT id, idempotency_key, job, batch_id, endpoint, recipient, state, attempt_count,
       next_attempt_at, created_at, updated_at, delivered_at, last_error,
       payload, payload_sha256, ordering_key, lease_owner, lease_expires_at
FROM visible_effects
WHERE idempotency_key = :key;

-- name: attempts_of_effect
-- The attempt timeline of one effect, oldest first (ix_delivery_attempts_effect_id_attempt).
SELECT attempt, worker_id, started_at, duration_ms, outcome, status_code, error_class, error,
       response_excerpt
FROM delivery_attempts
WHERE effect_id = :effect_id
ORDER BY attempt, id
LIMIT :limit;

-- name: ledger_entry
-- A key whose effect row retention has purged is still known to the ledger.
SELECT idempotency_key, endpoint, delivered_at FROM key_ledger WHERE idempotency_key = :key;

-- name: search_effects
-- The audit search: a keyset page ordered by (created_at, id) descending. Absent
-- filters are NULL; psycopg2 sends literals, so the planner folds the
-- "IS NULL OR" branches away and picks the index of the filters given
-- (ix_effects_{recipient,job_batch_id,endpoint,state}_created_at_id). LIMIT NULL
-- (the CSV export) means no limit.
SELECT id, idempotency_key, job, batch_id, endpoint, recipient, state, attempt_count,
       next_attempt_at, created_at, updated_at, delivered_at, last_error
FROM visible_effects
WHERE created_at >= :since AND created_at < :until
  AND (CAST(:job AS text) IS NULL OR job = :job)
  AND (CAST(:batch_id AS text) IS NULL OR batch_id = :batch_id)
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
  AND (CAST(:recipient AS text) IS NULL OR recipient = :recipient)
  AND (CAST(:state AS text) IS NULL OR state = :state)
  AND (CAST(:cursor_at AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:cursor_at AS timestamptz), CAST(:cursor_id AS bigint)))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: batch_marker
-- The commit marker of one batch (uq_batches_job_batch_id).
SELECT job, batch_id, run_id, spark_app_id, committed_at, result_rows, effects_total,
       effects_new, effects_deduplicated, payload_mismatches, rejects, duration_s
FROM batches
WHERE job = :job AND batch_id = :batch_id;

-- name: batches_of_job
-- A job's batches, newest first (ix_batches_job_committed_at).
SELECT job, batch_id, run_id, spark_app_id, committed_at, result_rows, effects_total,
       effects_new, effects_deduplicated, payload_mismatches, rejects, duration_s
FROM batches
WHERE job = :job
ORDER BY committed_at DESC, id DESC
LIMIT :limit;

-- name: batch_live_counts
-- What the batch's effects are doing now (ix_effects_job_batch_id_created_at_id).
SELECT state, count(*) AS n FROM visible_effects
WHERE job = :job AND batch_id = :batch_id
GROUP BY state;

-- name: batch_reject_count
-- Rows the sink refused, as stored (ix_rejects_job_batch_id).
SELECT count(*) FROM rejects WHERE job = :job AND batch_id = :batch_id;

-- name: operator_actions
-- The operators' audit trail, newest first; keyset on id.
SELECT id, at, actor, action, target, reason, details
FROM operator_actions
WHERE CAST(:before_id AS bigint) IS NULL OR id < :before_id
ORDER BY id DESC
LIMIT :limit;
