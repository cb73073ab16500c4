-- Statements the executors run (through psycopg2): each partition writes its
-- effects straight into the outbox, invisible until its run's marker commits.

-- name: create_incoming
-- Where a chunk goes when some of its keys are taken: COPY here (no WAL, no
-- index), then one insert that skips the taken keys, which are classified.
CREATE TEMP TABLE IF NOT EXISTS incoming_effects (
    job text NOT NULL,
    batch_id text NOT NULL,
    run_id uuid NOT NULL,
    idempotency_key text NOT NULL,
    endpoint text NOT NULL,
    recipient text,
    payload jsonb NOT NULL,
    payload_sha256 text NOT NULL,
    ordering_key text,
    reference text,
    supersedes text,
    expires_at timestamptz,
    next_attempt_at timestamptz
) ON COMMIT DELETE ROWS;

-- name: ledger_is_empty
-- Most outboxes have purged nothing yet: then no chunk needs the ledger probe.
SELECT NOT EXISTS (SELECT 1 FROM key_ledger);

-- name: ledger_keys
-- Keys delivered and purged are never enqueued again: they leave the chunk
-- before it is written (deduplicated; a mismatch if the payload differs).
SELECT idempotency_key, payload_sha256 FROM key_ledger
WHERE idempotency_key = ANY(%(keys)s);

-- name: copy_effects
-- Binary COPY (spark_outbox.spark.pgbinary): no CSV parse of the payloads' quotes.
-- The fast path while no key of this task was taken yet (under a savepoint):
-- straight into the outbox, in parallel with the other partitions. A taken
-- key raises unique_violation and the chunk goes through incoming_effects.
COPY effects (job, batch_id, run_id, idempotency_key, endpoint, recipient, payload,
              payload_sha256, ordering_key, reference, supersedes, expires_at)
FROM STDIN WITH (FORMAT binary);

-- name: copy_scheduled_effects
-- The same for rows with not_before (the default next_attempt_at is now()).
COPY effects (job, batch_id, run_id, idempotency_key, endpoint, recipient, payload,
              payload_sha256, ordering_key, reference, supersedes, expires_at, next_attempt_at)
FROM STDIN WITH (FORMAT binary);

-- name: copy_incoming
COPY incoming_effects (job, batch_id, run_id, idempotency_key, endpoint, recipient, payload,
                       payload_sha256, ordering_key, reference, supersedes, expires_at)
FROM STDIN WITH (FORMAT binary);

-- name: copy_scheduled_incoming
COPY incoming_effects (job, batch_id, run_id, idempotency_key, endpoint, recipient, payload,
                       payload_sha256, ordering_key, reference, supersedes, expires_at,
                       next_attempt_at)
FROM STDIN WITH (FORMAT binary);

-- name: insert_effects
-- The chunk where keys may be taken: those rows are skipped here, classified next.
INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, recipient, payload,
                     payload_sha256, ordering_key, reference, supersedes, expires_at,
                     next_attempt_at)
SELECT i.idempotency_key, i.job, i.batch_id, i.run_id, i.endpoint, i.recipient, i.payload,
       i.payload_sha256, i.ordering_key, i.reference, i.supersedes, i.expires_at,
       COALESCE(i.next_attempt_at, now())
FROM incoming_effects i
WHERE NOT EXISTS (SELECT 1 FROM key_ledger l WHERE l.idempotency_key = i.idempotency_key)
ON CONFLICT (idempotency_key) DO NOTHING;

-- name: classify_taken
-- Every row of the chunk whose key was taken, by whom: a visible effect (an
-- earlier batch, enqueue(), or the key ledger) -> deduplicated, a mismatch if
-- the stored hash differs; this run itself (a twin in the batch, or a retried
-- Spark task) -> this run's own, a mismatch if the hash differs; anyone else
-- (a run with no marker: dead or in flight, or a row gone meanwhile) ->
-- deferred whole to deferred_effects, for this run's commit to decide.
WITH classified AS (
    SELECT i.*,
           CASE WHEN v.id IS NOT NULL THEN v.payload_sha256
                WHEN e.run_id = CAST(%(run_id)s AS uuid) THEN e.payload_sha256
                WHEN e.id IS NULL THEN l.payload_sha256
           END AS stored_sha256
    FROM incoming_effects i
    LEFT JOIN effects e ON e.idempotency_key = i.idempotency_key
    LEFT JOIN visible_effects v ON v.idempotency_key = i.idempotency_key
    LEFT JOIN key_ledger l ON l.idempotency_key = i.idempotency_key
), deferred AS (
    INSERT INTO deferred_effects (run_id, task_id, idempotency_key, endpoint, recipient, payload,
                                  payload_sha256, ordering_key, reference, supersedes,
                                  not_before, expires_at)
    SELECT %(run_id)s, %(task_id)s, c.idempotency_key, c.endpoint, c.recipient, c.payload,
           c.payload_sha256, c.ordering_key, c.reference, c.supersedes, c.next_attempt_at,
           c.expires_at
    FROM classified c WHERE c.stored_sha256 IS NULL
    RETURNING 1
)
SELECT count(*) FILTER (WHERE c.stored_sha256 <> c.payload_sha256) AS mismatches,
       (SELECT count(*) FROM deferred) AS deferred,
       -- a few of them by key, for the driver's WARNING (never the payloads)
       (array_agg(c.idempotency_key ORDER BY c.idempotency_key)
            FILTER (WHERE c.stored_sha256 <> c.payload_sha256))[1:5] AS mismatch_keys
FROM classified c;

-- name: stage_rejects
-- Rows that broke the contract, with their reason: moved to rejects by the commit.
COPY staged_rejects (run_id, task_id, reason, raw_row) FROM STDIN WITH (FORMAT csv);

-- name: stage_results
-- Result rows go into the user's table in the commit transaction: staged until then.
COPY staged_results (run_id, task_id, row) FROM STDIN WITH (FORMAT csv);
