-- name: count_purgeable
-- The dry run: finished effects not yet purged whose finish (updated_at) is
-- older than the cutoff (ix_effects_purgeable, and ix_effects_expired for the
-- expired ones: the first index predates that state).
SELECT (SELECT count(*) FROM effects
        WHERE purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')
          AND updated_at < :cutoff)
     + (SELECT count(*) FROM effects
        WHERE state = 'expired' AND purged_at IS NULL AND updated_at < :cutoff);

-- name: purge_batch
-- One small batch in its own short transaction: the oldest finished rows, locked
-- with SKIP LOCKED (several purgers share the work, nothing waits), lose their
-- payload and attempts; the row stays as a stub and the key goes to the ledger
-- with its final state, so it can never be enqueued or sent again. The rows with a
-- last_error come back with the payload they had (the CTEs share one snapshot), for
-- the purge to mask that outside text before the payload is gone (scrub_errors);
-- only when there is something to mask (:masking: OUTBOX_SENSITIVE_FIELDS is set).
-- Expired effects are a range of their own (ix_effects_expired): at most
-- :batch_size of each kind a batch.
WITH finished AS (
    SELECT id, payload, last_error FROM effects
    WHERE purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')
      AND updated_at < :cutoff
    ORDER BY updated_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), expired AS (
    SELECT id, payload, last_error FROM effects
    WHERE state = 'expired' AND purged_at IS NULL AND updated_at < :cutoff
    ORDER BY updated_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), doomed AS (
    SELECT * FROM finished UNION ALL SELECT * FROM expired
), attempts AS (
    DELETE FROM delivery_attempts a USING doomed d
    WHERE a.effect_id = d.id
    RETURNING 1
), purged AS (
    UPDATE effects e SET payload = '{}'::jsonb, purged_at = now()
    FROM doomed d
    WHERE e.id = d.id
    RETURNING e.idempotency_key, e.endpoint, e.payload_sha256, e.state, e.updated_at,
              e.delivered_at
), ledger AS (
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, state, finished_at,
                            delivered_at)
    SELECT idempotency_key, endpoint, payload_sha256, state, updated_at,
           CASE WHEN state = 'delivered' THEN COALESCE(delivered_at, updated_at) END
    FROM purged
    ON CONFLICT (idempotency_key) DO NOTHING
)
SELECT (SELECT count(*) FROM purged) AS effects, (SELECT count(*) FROM attempts) AS attempts,
       (SELECT jsonb_agg(jsonb_build_array(id, payload, last_error)) FROM doomed
        WHERE last_error IS NOT NULL AND CAST(:masking AS boolean)) AS errors;

-- name: scrub_errors
-- In the purge's transaction: the purged rows' last_error, masked with the payload
-- just dropped (a masked text can no longer be masked once the payload is gone).
UPDATE effects e SET last_error = s.last_error
FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS s(id, last_error)
WHERE e.id = s.id;

-- name: purge_result_rows
-- What batches committed before the cutoff recorded of their result rows (only
-- reconciliation reads it, and reports a batch without it as not comparable):
-- a small batch per transaction; the batches table holds one row per batch.
DELETE FROM batch_result_rows WHERE (batch_ref, key) IN (
    SELECT r.batch_ref, r.key FROM batch_result_rows r
    WHERE r.batch_ref IN (SELECT b.id FROM batches b WHERE b.committed_at < :cutoff)
    LIMIT :batch_size);

-- name: purge_mismatches
-- enqueue()'s payload mismatches older than the cutoff (ix_enqueue_mismatches_at):
-- they matter for the day status shows, not for the history.
DELETE FROM enqueue_mismatches WHERE at < :cutoff;
