-- name: effects_by_endpoint_state
-- The report's core: how many effects each endpoint has in each state.
SELECT endpoint, state, count(*) AS n FROM visible_effects GROUP BY endpoint, state;

-- name: attempts_by_endpoint_outcome
-- Every delivery attempt, by endpoint and outcome (delivered, retry, dead, gone, stale).
SELECT f.endpoint, a.outcome, count(*) AS n
FROM delivery_attempts a JOIN visible_effects f ON f.id = a.effect_id
GROUP BY f.endpoint, a.outcome;

-- name: retried_effects
-- Effects that needed at least one retry: each is counted once, however many it needed.
SELECT f.endpoint, count(DISTINCT a.effect_id) AS n
FROM delivery_attempts a JOIN visible_effects f ON f.id = a.effect_id
WHERE a.outcome = 'retry'
GROUP BY f.endpoint;

-- name: batches_by_job
-- What the batch markers recorded per job.
SELECT job, count(*) AS batches,
       COALESCE(sum(result_rows), 0) AS result_rows,
       COALESCE(sum(effects_total), 0) AS effects_total,
       COALESCE(sum(effects_new), 0) AS effects_new,
       COALESCE(sum(effects_deduplicated), 0) AS effects_deduplicated,
       COALESCE(sum(payload_mismatches), 0) AS payload_mismatches,
       COALESCE(sum(rejects), 0) AS rejects
FROM batches GROUP BY job ORDER BY job;

-- name: reject_count
-- Rows a job produced that broke the effect contract, kept with their reason.
SELECT count(*) FROM rejects;

-- name: reject_reasons
-- A few reasons, for the report.
SELECT reason, count(*) AS n FROM rejects GROUP BY reason ORDER BY n DESC, reason LIMIT :limit;

-- name: unfinished_count
-- Effects still to be delivered (pending or under a lease), to wait for a drain.
SELECT count(*) FROM visible_effects WHERE state IN ('pending', 'leased');

-- name: delivered_count
-- Progress of a drain.
SELECT count(*) FROM visible_effects WHERE state = 'delivered';

-- name: dead_letters
-- The first dead effects with their reason, for the report.
SELECT idempotency_key, endpoint, attempt_count, last_error
FROM visible_effects WHERE state = 'dead' ORDER BY id LIMIT :limit;

-- name: delivered_keys
-- Keys delivered to one endpoint, to compare with what a receiver saw.
SELECT idempotency_key FROM visible_effects WHERE endpoint = :endpoint AND state = 'delivered';

-- name: effect_keys
-- Every key enqueued for one endpoint, whatever its state.
SELECT idempotency_key FROM visible_effects WHERE endpoint = :endpoint;

-- name: invoice_fingerprint
-- The whole invoices table as one digest: two databases with equal digests hold
-- the same invoices (every column that a re-run must reproduce; not updated_at).
SELECT count(*) AS n,
       COALESCE(sum(amount), 0) AS total_amount,
       md5(COALESCE(string_agg(
           concat_ws('|', invoice_id, customer_id, invoice_date, currency, amount, units,
                     event_count, customer_email),
           ',' ORDER BY invoice_id), '')) AS digest
FROM invoices;

-- name: open_transactions
-- Sessions of this database inside an open transaction, other than this one: a
-- killed driver's commit shows here until the server notices the dead connection.
SELECT count(*) AS n, COALESCE(max(extract(epoch FROM now() - xact_start)), 0) AS oldest_s
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND state IN ('idle in transaction', 'active') AND xact_start IS NOT NULL
  AND backend_type = 'client backend';

-- name: committed_batches
-- Batches of :job that have their commit marker, for progress lines.
SELECT count(*) AS batches, COALESCE(sum(result_rows), 0) AS result_rows,
       COALESCE(sum(effects_new), 0) AS effects_new
FROM batches WHERE job = :job;

-- name: invoice_dates
-- The days a job has invoiced (a stream closes a day once the watermark passes it).
SELECT DISTINCT invoice_date FROM invoices WHERE job = :job ORDER BY invoice_date;

-- name: batch_states
-- What one batch's effects are doing now (the volume guard stage).
SELECT state, count(*) FROM visible_effects
WHERE job = :job AND batch_id = :batch_id GROUP BY state;
