-- Lists as support reads them (spark_outbox.console.lists): how many a search
-- matches, a state's effects per endpoint, repeated reasons grouped, many keys at
-- once. Every count stops at a cap, so a list of any size costs at most the cap.

-- name: count_matching
-- How many effects the search's filter matches (audit.sql search_effects, without
-- its page), counted up to :cap_plus_one on the filter's own index.
SELECT count(*) FROM (
    SELECT 1 FROM visible_effects
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
    LIMIT :cap_plus_one
) matching;

-- name: state_by_endpoint
-- One state's effects per registered endpoint, each counted up to :cap_plus_one
-- on the endpoint's own range (dead: ix_effects_dead_endpoint_updated_at; pending
-- and leased: ix_effects_due; the others: ix_effects_endpoint_created_at_id
-- within the window), so a million delivered effects cost no more than the cap.
SELECT ep.name AS endpoint, c.n
FROM endpoints ep
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM visible_effects e
        WHERE e.endpoint = ep.name AND e.state = :state
          AND (CAST(:since AS timestamptz) IS NULL OR e.created_at >= :since)
          AND (CAST(:until AS timestamptz) IS NULL OR e.created_at < :until)
        LIMIT :cap_plus_one
    ) x
) c
WHERE c.n > 0
ORDER BY c.n DESC, ep.name;

-- name: errors_grouped
-- A list's repeated reasons (last_error) with how often each occurs, most
-- frequent first, over the newest :scan_limit effects the filter matches; one
-- effect of each group (the newest) masks it for support.
SELECT m.last_error AS reason, count(*) AS n, max(m.id) AS sample_id
FROM (
    SELECT id, last_error FROM visible_effects
    WHERE state = :state
      AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
      AND (CAST(:since AS timestamptz) IS NULL OR created_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR created_at < :until)
    ORDER BY created_at DESC, id DESC
    LIMIT :scan_limit
) m
WHERE m.last_error IS NOT NULL
GROUP BY m.last_error
ORDER BY n DESC, reason
LIMIT :groups;

-- name: reject_reasons
-- A batch's rejects by reason, most frequent first (ix_rejects_job_batch_id_id),
-- with one raw row of each (the newest) to mask the reason for support.
SELECT r.reason, count(*) AS n, max(r.id) AS sample_id
FROM rejects r
WHERE r.job = :job AND r.batch_id = :batch_id
GROUP BY r.reason
ORDER BY n DESC, r.reason
LIMIT :groups;

-- name: raw_rows_by_id
-- The sample rows of grouped reasons (pk_rejects).
SELECT id, raw_row FROM rejects WHERE id = ANY(CAST(:ids AS bigint[]));

-- name: held_by_endpoint
-- Effects waiting in held batches, per endpoint (ix_batches_run_id_held, then each
-- held batch's range of ix_effects_job_batch_id_created_at_id).
SELECT e.endpoint, count(*) AS n
FROM batches b
JOIN visible_effects e ON e.job = b.job AND e.batch_id = b.batch_id
WHERE b.hold_state = 'held' AND e.state = 'pending'
GROUP BY e.endpoint
ORDER BY n DESC, e.endpoint;

-- name: by_key_prefix
-- Many keys or key prefixes at once: each a range of uq_effects_idempotency_key
-- (filters.EffectFilter.params says why a range), at most two effects per prefix
-- (two: the prefix is ambiguous).
SELECT p.ord, e.idempotency_key, e.endpoint, e.recipient, e.reference, e.state,
       e.attempt_count, e.created_at, e.delivered_at, e.purged_at
FROM unnest(CAST(:prefixes AS text[]), CAST(:ends AS text[])) WITH ORDINALITY
     AS p(prefix, prefix_end, ord)
CROSS JOIN LATERAL (
    SELECT * FROM visible_effects v
    WHERE v.idempotency_key >= p.prefix AND v.idempotency_key < p.prefix_end
      AND starts_with(v.idempotency_key, p.prefix)
    ORDER BY v.idempotency_key
    LIMIT 2
) e
ORDER BY p.ord, e.idempotency_key;

-- name: payloads_by_id
-- The payloads of grouped errors' sample effects, to mask them for support (pk_effects).
SELECT id, payload FROM effects WHERE id = ANY(CAST(:ids AS bigint[]));
