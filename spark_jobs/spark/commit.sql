-- The driver's statements: the replay check, the run's registration, the ONE
-- commit transaction (its steps in order), and the sweeper.

-- name: read_marker
-- The replay check, and how an unknown COMMIT outcome is resolved: the marker says.
SELECT run_id, result_rows, effects_total, effects_new, effects_deduplicated,
       payload_mismatches, rejects, hold_reason
FROM batches WHERE job = :job AND batch_id = :batch_id;

-- name: endpoint_kinds
-- Read once per batch and handed to the executors: unknown endpoints are rejects,
-- e-mail endpoints get the e-mail contract check, archived ones (kind 'archived'
-- here, spark/checks.py ARCHIVED) are rejects naming them.
SELECT name, CASE WHEN archived_at IS NULL THEN kind ELSE 'archived' END AS kind
FROM endpoints;

-- name: database_answers
-- After an outage: the sink writes the batch again once a connection answers this.
SELECT 1;

-- name: begin_run
-- Registers the run before it writes anything, so its rows can be swept if it dies.
INSERT INTO batch_runs (run_id, job, batch_id) VALUES (:run_id, :job, :batch_id);

-- name: claim_run
-- First in the commit: a run the sweeper has begun to sweep can no longer commit,
-- and once this row is gone (at COMMIT) the sweeper no longer touches the run.
DELETE FROM batch_runs WHERE run_id = :run_id AND swept_at IS NULL RETURNING run_id;

-- name: insert_marker
-- The fence: a racing run waits on the unique index and then finds the conflict;
-- nothing is returned when another run won. Committed, it makes the run's
-- effects visible (the visible_effects view looks markers up by run_id). It
-- names where the batch's result rows go, for reconciliation (migration 2721).
INSERT INTO batches (job, batch_id, run_id, spark_app_id, trace_parent, trace_state,
                     results_table, result_keys, result_columns, result_stamp)
VALUES (:job, :batch_id, :run_id, :spark_app_id, :trace_parent, :trace_state, :results_table,
        CAST(:result_keys AS text[]), CAST(:result_columns AS text[]),
        CAST(:result_stamp AS text[]))
ON CONFLICT (job, batch_id) DO NOTHING
RETURNING id;

-- name: count_staged
-- What the succeeded tasks reported must all be here (UNLOGGED staging is lost on
-- a server crash; a swept run has none), or the commit rolls back.
SELECT (SELECT count(*) FROM staged_results
        WHERE run_id = :run_id AND task_id = ANY(:result_tasks)) AS results,
       (SELECT count(*) FROM staged_rejects
        WHERE run_id = :run_id AND task_id = ANY(:effect_tasks)) AS rejects,
       (SELECT count(*) FROM deferred_effects
        WHERE run_id = :run_id AND task_id = ANY(:effect_tasks)) AS deferred;

-- name: first_reject_reasons
-- For on_invalid="fail": what to tell the person who wrote the job.
SELECT reason FROM staged_rejects
WHERE run_id = :run_id AND task_id = ANY(:task_ids)
ORDER BY reason LIMIT :limit;

-- name: move_rejects
-- Rows that broke the contract, kept with their reason in the same commit, never dropped.
INSERT INTO rejects (job, batch_id, run_id, reason, raw_row)
SELECT :job, :batch_id, s.run_id, s.reason, s.raw_row
FROM staged_rejects s
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids);

-- name: take_visibility_lock
-- Serialises the final step of commits (and enqueue's take-over): while it is
-- held no other marker commits, so "invisible" cannot turn "visible" mid-decision.
SELECT pg_advisory_xact_lock(:lock_id);

-- name: take_over_deferred
-- Deferred keys whose row still belongs to a run without a marker (or is gone)
-- become this run's: never swallowed by a run that may never commit. Keys held
-- by a visible effect are left alone (deduplicated), as are keys in the ledger.
INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, recipient, payload,
                     payload_sha256, ordering_key, reference, supersedes, next_attempt_at,
                     expires_at)
SELECT DISTINCT ON (d.idempotency_key)
       d.idempotency_key, :job, :batch_id, d.run_id, d.endpoint, d.recipient, d.payload,
       d.payload_sha256, d.ordering_key, d.reference, d.supersedes, COALESCE(d.not_before, now()),
       d.expires_at
FROM deferred_effects d
WHERE d.run_id = :run_id AND d.task_id = ANY(:task_ids)
  AND NOT EXISTS (SELECT 1 FROM key_ledger l WHERE l.idempotency_key = d.idempotency_key)
ORDER BY d.idempotency_key, d.task_id
ON CONFLICT (idempotency_key) DO UPDATE
SET job = EXCLUDED.job, batch_id = EXCLUDED.batch_id, run_id = EXCLUDED.run_id,
    endpoint = EXCLUDED.endpoint, recipient = EXCLUDED.recipient, payload = EXCLUDED.payload,
    payload_sha256 = EXCLUDED.payload_sha256, ordering_key = EXCLUDED.ordering_key,
    reference = EXCLUDED.reference, supersedes = EXCLUDED.supersedes,
    next_attempt_at = EXCLUDED.next_attempt_at, expires_at = EXCLUDED.expires_at,
    created_at = now(), updated_at = now()
WHERE effects.run_id IS DISTINCT FROM EXCLUDED.run_id
  AND NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.id = effects.id);

-- name: count_deferred_mismatches
-- After the take-over: deferred keys that a visible effect of someone else kept,
-- with another payload (or the ledger's, when the effect was purged); a few keys.
SELECT count(*), (array_agg(d.idempotency_key ORDER BY d.idempotency_key))[1:5] FROM (
    SELECT DISTINCT ON (d.idempotency_key) d.idempotency_key, d.payload_sha256
    FROM deferred_effects d
    WHERE d.run_id = :run_id AND d.task_id = ANY(:task_ids)
    ORDER BY d.idempotency_key, d.task_id
) d
WHERE EXISTS (SELECT 1 FROM visible_effects v
              WHERE v.idempotency_key = d.idempotency_key
                AND v.run_id IS DISTINCT FROM :run_id
                AND v.payload_sha256 <> d.payload_sha256)
   OR EXISTS (SELECT 1 FROM key_ledger l
              WHERE l.idempotency_key = d.idempotency_key
                AND l.payload_sha256 <> d.payload_sha256
                AND NOT EXISTS (SELECT 1 FROM effects e
                                WHERE e.idempotency_key = d.idempotency_key));

-- name: count_own_effects
-- The batch's new effects per endpoint (the volume guard's input): the rows
-- this run owns after the take-over (ix_effects_job_batch_id_created_at_id).
SELECT endpoint, count(*) FROM effects
WHERE job = :job AND batch_id = :batch_id AND run_id = :run_id
GROUP BY endpoint;

-- name: results_columns
-- The results table's columns: result rows are applied by name, so names are checked;
-- NOT NULL ones are where a null row is refused, those without a default must be given.
SELECT attname, attnotnull,
       attnotnull AND NOT atthasdef AND attidentity = '' AND attgenerated = '' AS required
FROM pg_attribute
WHERE attrelid = to_regclass(:table) AND attnum > 0 AND NOT attisdropped;

-- name: apply_results_template
-- Template (identifiers quoted by the driver after checking them against the
-- catalog): works for any results table, rows applied with jsonb_populate_record.
-- {rows} picks the staged rows: the succeeded tasks', or one slice of a task's
-- (spark_outbox.spark.result_rejects, when a row was refused).
-- Results go into the user's table, so they are merged here, in the commit. Each
-- row is recorded for the batch as it stands after the merge (its key and the
-- digest of the written columns: spark_outbox.core.resultrows), so reconciliation
-- can tell later whether the table still holds what the batch wrote.
WITH applied AS (
    INSERT INTO {table} ({columns})
    SELECT {record_columns}
    FROM staged_results s CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, s.row) r
    WHERE s.run_id = :run_id AND {rows}
    ON CONFLICT ({conflict_keys}) DO UPDATE SET {assignments}
    RETURNING {key} AS key, {digest} AS row_sha256
), recorded AS (
    INSERT INTO batch_result_rows (batch_ref, key, row_sha256)
    SELECT :batch_ref, key, row_sha256 FROM applied
    ON CONFLICT DO NOTHING
)
SELECT count(*) FROM applied;

-- name: insert_results_template
-- The same for a results DataFrame of conflict keys only: nothing to overwrite
-- or add (DO UPDATE SET needs a column), so a row already there is kept; every
-- staged row is recorded (the table holds its key either way), counted applied
-- only if it was new.
WITH applied AS (
    INSERT INTO {table} ({columns})
    SELECT {record_columns}
    FROM staged_results s CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, s.row) r
    WHERE s.run_id = :run_id AND {rows}
    ON CONFLICT ({conflict_keys}) DO NOTHING
    RETURNING 1
), recorded AS (
    INSERT INTO batch_result_rows (batch_ref, key, row_sha256)
    SELECT :batch_ref, {staged_key}, {staged_digest}
    FROM staged_results s CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, s.row) r
    WHERE s.run_id = :run_id AND {rows}
    ON CONFLICT DO NOTHING
)
SELECT count(*) FROM applied;

-- name: hold_effects
-- A held batch's effects wait at the far end of the due index: the claim's range
-- scan of ix_effects_due stops at now() and never walks them (a held batch is
-- big by definition); a release makes them due again (dispatcher/console/holds.sql).
UPDATE effects SET next_attempt_at = 'infinity'
WHERE job = :job AND batch_id = :batch_id AND run_id = :run_id AND state = 'pending';

-- name: finish_marker
UPDATE batches
SET result_rows = :result_rows, effects_total = :effects_total, effects_new = :effects_new,
    effects_deduplicated = :effects_deduplicated, payload_mismatches = :payload_mismatches,
    rejects = :rejects, duration_s = :duration_s,
    effects_new_by_endpoint = CAST(:by_endpoint AS jsonb),
    hold_state = :hold_state, hold_reason = :hold_reason
WHERE job = :job AND batch_id = :batch_id;

-- name: delete_staging
-- The run's staging, deferred and staged rows alike, once they are used (or swept).
WITH r AS (DELETE FROM staged_results WHERE run_id = ANY(CAST(:run_ids AS uuid[]))),
     j AS (DELETE FROM staged_rejects WHERE run_id = ANY(CAST(:run_ids AS uuid[])))
DELETE FROM deferred_effects WHERE run_id = ANY(CAST(:run_ids AS uuid[]));

-- name: runs_to_sweep
-- Runs that can never commit: another run committed their batch, or they are
-- older than the grace period. swept_at fences their commit (claim_run).
UPDATE batch_runs a SET swept_at = now()
WHERE a.swept_at IS NULL
  AND (a.started_at < now() - make_interval(secs => :grace_s)
       OR EXISTS (SELECT 1 FROM batches b
                  WHERE b.job = a.job AND b.batch_id = a.batch_id AND b.run_id <> a.run_id));

-- name: mark_swept
-- A run that failed before its commit: swept at once.
UPDATE batch_runs SET swept_at = now() WHERE run_id = :run_id AND swept_at IS NULL;

-- name: swept_runs
-- Runs whose sweep has begun (this sweeper's, or one that died halfway).
SELECT run_id, job, batch_id FROM batch_runs WHERE swept_at IS NOT NULL LIMIT :limit;

-- name: delete_run_effects
-- A swept run's effect rows, a small batch at a time, found through the batch's
-- index (ix_effects_job_batch_id_created_at_id); never a row with a marker, never
-- one with an attempt (the attempt log has no foreign key: migration 2001).
DELETE FROM effects WHERE id IN (
    SELECT e.id FROM effects e
    WHERE e.job = :job AND e.batch_id = :batch_id AND e.run_id = :run_id
      AND NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.id = e.id)
      AND NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.effect_id = e.id)
    LIMIT :limit);

-- name: delete_run
DELETE FROM batch_runs WHERE run_id = :run_id AND swept_at IS NOT NULL;
