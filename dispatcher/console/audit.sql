-- name: effect_by_key
-- One effect by its key (uq_effects_idempotency_key). A finished effect (delivered,
-- dead, cancelled, expired) has no next attempt, whatever the column still holds,
-- and neither has an uncertain one: nothing sends it before an operator decides.
SELECT id, idempotency_key, job, batch_id, endpoint, recipient, reference, state,
       attempt_count,
       CASE WHEN state IN ('delivered', 'dead', 'cancelled', 'uncertain', 'expired') THEN NULL
            WHEN next_attempt_at = 'infinity' THEN NULL  -- a held batch's
            ELSE next_attempt_at END AS next_attempt_at,
       created_at, updated_at, delivered_at, last_error,
       purged_at, payload, payload_sha256, ordering_key, lease_owner, lease_expires_at,
       supersedes, resend_action_id, expires_at
FROM visible_effects
WHERE idempotency_key = :key;

-- name: superseded_by
-- The corrections of an effect: the chain read backwards (ix_effects_supersedes).
SELECT idempotency_key FROM visible_effects
WHERE supersedes = :key
ORDER BY created_at, id
LIMIT 20;

-- name: attempts_of_effect
-- The attempt timeline of one effect, oldest first (ix_delivery_attempts_effect_id_attempt);
-- an attempt of a resend with the operator who asked for it (pk_operator_actions).
SELECT a.attempt, a.worker_id, a.started_at, a.duration_ms, a.outcome, a.status_code,
       a.error_class, a.error, a.response_excerpt, a.resend_action_id,
       oa.actor AS resend_by, a.trace_parent
FROM delivery_attempts a
LEFT JOIN operator_actions oa ON oa.id = a.resend_action_id
WHERE a.effect_id = :effect_id
ORDER BY a.attempt, a.id
LIMIT :limit;

-- name: action_by_id
-- One operator action (pk_operator_actions): the resend an effect carries.
SELECT id, at, actor, action, target, reason, details
FROM operator_actions
WHERE id = :id;

-- name: ledger_entry
-- A key whose effect row retention has purged is still known to the ledger.
SELECT idempotency_key, endpoint, state, COALESCE(delivered_at, finished_at) AS finished_at
FROM key_ledger
WHERE idempotency_key = :key;

-- name: search_effects
-- The audit search: a keyset page ordered by (created_at, id) descending. Absent
-- filters are NULL; psycopg2 sends literals, so the planner folds the
-- "IS NULL OR" branches away and picks the index of the filters given
-- (ix_effects_{recipient,reference,job_batch_id,endpoint,state}_created_at_id, or a
-- range of uq_effects_idempotency_key for a key prefix: filters.EffectFilter.params).
-- LIMIT NULL (the CSV export) means no limit; since and until are NULL for a narrow
-- search (filters.py), which any age may match.
SELECT id, idempotency_key, job, batch_id, endpoint, recipient, reference, state, attempt_count,
       CASE WHEN state IN ('delivered', 'dead', 'cancelled', 'uncertain', 'expired') THEN NULL
            WHEN next_attempt_at = 'infinity' THEN NULL  -- a held batch's
            ELSE next_attempt_at END AS next_attempt_at,
       created_at, updated_at, delivered_at, last_error, purged_at
FROM visible_effects
WHERE (CAST(:since AS timestamptz) IS NULL OR created_at >= :since)
  AND (CAST(:until AS timestamptz) IS NULL OR created_at < :until)
  AND (CAST(:job AS text) IS NULL OR job = :job)
  AND (CAST(:batch_id AS text) IS NULL OR batch_id = :batch_id)
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
  AND (CAST(:recipient AS text) IS NULL OR recipient = :recipient)
  AND (CAST(:reference AS text) IS NULL OR reference = :reference)
  AND (CAST(:state AS text) IS NULL OR state = :state)
  AND (CAST(:key_prefix AS text) IS NULL
       OR (idempotency_key >= :key_prefix AND idempotency_key < :key_prefix_end
           AND starts_with(idempotency_key, :key_prefix)))
  AND (CAST(:cursor_at AS timestamptz) IS NULL
       OR (created_at, id) < (CAST(:cursor_at AS timestamptz), CAST(:cursor_id AS bigint)))
ORDER BY created_at DESC, id DESC
LIMIT :limit;

-- name: batch_marker
-- The commit marker of one batch (uq_batches_job_batch_id).
SELECT job, batch_id, run_id, spark_app_id, committed_at, result_rows, effects_total,
       effects_new, effects_deduplicated, payload_mismatches, rejects, duration_s,
       hold_state, hold_reason, effects_purged
FROM batches
WHERE job = :job AND batch_id = :batch_id;

-- name: batches_of_job
-- A job's batches, newest first (ix_batches_job_committed_at).
SELECT job, batch_id, run_id, spark_app_id, committed_at, result_rows, effects_total,
       effects_new, effects_deduplicated, payload_mismatches, rejects, duration_s,
       hold_state, hold_reason, effects_purged
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
-- Rows the sink refused, as stored (ix_rejects_job_batch_id_id).
SELECT count(*) FROM rejects WHERE job = :job AND batch_id = :batch_id;

-- name: operator_actions
-- The operators' audit trail, newest first; keyset on id; one actor's only when
-- :actor is given (the system's changes, say: a filter on the walk of the key).
SELECT id, at, actor, action, target, reason, details
FROM operator_actions
WHERE (CAST(:before_id AS bigint) IS NULL OR id < :before_id)
  AND (CAST(:actor AS text) IS NULL OR actor = :actor)
ORDER BY id DESC
LIMIT :limit;

-- name: payloads_by_id
-- The payloads of a page of effects, to mask their last_error for the support role (pkey).
SELECT id, payload FROM effects WHERE id = ANY(CAST(:ids AS bigint[]));
-- name: batch_exists
-- Does (job, batch_id) name a committed batch? (uq_batches_job_batch_id)
SELECT EXISTS (SELECT 1 FROM batches WHERE job = :job AND batch_id = :batch_id);
