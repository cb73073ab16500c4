-- name: count_purgeable
-- The dry run: finished effects whose finish (updated_at) is older than the cutoff
-- (ix_effects_purgeable; ix_effects_expired for expired ones), and the stubs an erasure or an older release left
-- (ix_effects_stubs).
SELECT (SELECT count(*) FROM effects
        WHERE purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')
          AND updated_at < :cutoff)
     + (SELECT count(*) FROM effects
        WHERE state = 'expired' AND purged_at IS NULL AND updated_at < :cutoff)
     + (SELECT count(*) FROM effects WHERE purged_at IS NOT NULL AND updated_at < :cutoff);

-- name: purge_batch
-- One small batch in its own short transaction: the oldest finished effects after
-- the previous batch's last one (a keyset on ix_effects_purgeable, so no batch walks
-- the index entries its predecessors left behind), locked with SKIP LOCKED (several
-- purgers share the work, nothing waits), deleted with their attempts. Deleted, not
-- kept as a stub: an updated stub was a new row version in every index, and the
-- table only grew (bench/RESULTS.md, "history"). The key stays known to the key
-- ledger: the DELETE's trigger writes every finished key it deletes, with its final
-- state, in this transaction (objects/ledger.sql; outbox verify checks the trigger).
-- Each marker counts its batch's effects retention removed (reconciliation
-- explains them). Returns the counts and where the batch ended. {finished} is one
-- of the two ranges of finished effects (retention.RANGES): those of
-- ix_effects_purgeable, and the expired ones of ix_effects_expired (the first index
-- predates that state), each with a keyset of its own.
WITH doomed AS (
    SELECT id, updated_at, job, batch_id
    FROM effects
    WHERE {finished}
      AND updated_at < :bound
      AND (updated_at, id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
    ORDER BY updated_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM delivery_attempts a USING doomed d
    WHERE a.effect_id = d.id
    RETURNING 1
), gone AS (
    DELETE FROM effects e USING doomed d
    WHERE e.id = d.id
    RETURNING 1
), counted AS (
    UPDATE batches b SET effects_purged = b.effects_purged + n.effects
    FROM (SELECT job, batch_id, count(*) AS effects FROM doomed
          WHERE job IS NOT NULL GROUP BY job, batch_id) n
    WHERE b.job = n.job AND b.batch_id = n.batch_id
)
SELECT (SELECT count(*) FROM gone) AS effects, (SELECT count(*) FROM attempts) AS attempts,
       last.updated_at AS last_at, last.id AS last_id
FROM (SELECT NULL) one
LEFT JOIN LATERAL (SELECT updated_at, id FROM doomed ORDER BY updated_at DESC, id DESC
                   LIMIT 1) last ON true;

-- name: purge_stubs
-- The stubs an erasure left (payload, recipient and error blanked; purged_at set)
-- and those an older release's purge kept, once they finished before the cutoff:
-- deleted like the rest (ix_effects_stubs, a keyset as above). Their keys are in the
-- ledger already (the erasure and the older purge wrote them; the trigger leaves them).
WITH doomed AS (
    SELECT id, updated_at, job, batch_id FROM effects
    WHERE purged_at IS NOT NULL AND updated_at < :bound
      AND (updated_at, id) > (CAST(:after_at AS timestamptz), CAST(:after_id AS bigint))
    ORDER BY updated_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM delivery_attempts a USING doomed d
    WHERE a.effect_id = d.id
    RETURNING 1
), gone AS (
    DELETE FROM effects e USING doomed d
    WHERE e.id = d.id
    RETURNING 1
), counted AS (
    UPDATE batches b SET effects_purged = b.effects_purged + n.effects
    FROM (SELECT job, batch_id, count(*) AS effects FROM doomed
          WHERE job IS NOT NULL GROUP BY job, batch_id) n
    WHERE b.job = n.job AND b.batch_id = n.batch_id
)
SELECT (SELECT count(*) FROM gone) AS effects, (SELECT count(*) FROM attempts) AS attempts,
       last.updated_at AS last_at, last.id AS last_id
FROM (SELECT NULL) one
LEFT JOIN LATERAL (SELECT updated_at, id FROM doomed ORDER BY updated_at DESC, id DESC
                   LIMIT 1) last ON true;

-- name: count_forgettable
-- The dry run of the ledger's horizon: keys that finished before it.
SELECT count(*) FROM key_ledger WHERE finished_at < :bound;

-- name: forget_keys_edge
-- The ledger's horizon: keys that finished before it are forgotten, a batch in a
-- short transaction, oldest first (ix_key_ledger_finished_at). A batch takes the
-- next :batch_size finish times after the previous batch's last, and every key that
-- finished at the last of them too (keys finish in groups: one record statement,
-- one purge batch), so the next batch starts strictly after it and no key is
-- skipped or read twice. This is the last of them (NULL: none is left); forget_keys
-- gets it as a value, so its plan sees a range of a batch's size (as a CTE's
-- result it was planned as a third of the ledger: a scan of the ledger and of the
-- effects per batch, 16 s a batch at 10M effects).
SELECT max(f.finished_at) AS at
FROM (SELECT finished_at FROM key_ledger
      WHERE finished_at < :bound AND finished_at > CAST(:after_at AS timestamptz)
      ORDER BY finished_at
      LIMIT :batch_size) f;

-- name: forget_keys
-- The keys of a batch (forget_keys_edge) forgotten; rows another purger holds are
-- skipped (SKIP LOCKED). A forgotten key could be enqueued and sent again: the
-- horizon is an operator's choice, longer than any replay of a job and than the
-- purge's (docs/operations.md, "Retention"). A key whose effect is still there
-- stays (the effect's unique key guards it; an erasure's stub, or a delivery an
-- older release recorded here). Returns the keys forgotten.
WITH seen AS (
    SELECT l.idempotency_key FROM key_ledger l
    WHERE l.finished_at > CAST(:after_at AS timestamptz)
      AND l.finished_at <= CAST(:edge AS timestamptz)
    FOR UPDATE OF l SKIP LOCKED
), forgotten AS (
    DELETE FROM key_ledger k USING seen s
    WHERE k.idempotency_key = s.idempotency_key
      AND NOT EXISTS (SELECT 1 FROM effects e WHERE e.idempotency_key = s.idempotency_key)
    RETURNING 1
)
SELECT count(*) AS keys FROM forgotten;

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
