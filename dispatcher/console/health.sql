-- name: recent_deliveries
-- Throughput, to the minute: deliveries logged in the last 5 and 60 minutes (this
-- minute included), from the kept attempt counts (ix_attempt_counts_minute), never
-- from the attempt log itself (core/counts.py).
SELECT CAST(COALESCE(sum(n) FILTER (
           WHERE minute >= date_trunc('minute', now()) - interval '4 minutes'), 0) AS bigint)
           AS last_5m,
       CAST(COALESCE(sum(n), 0) AS bigint) AS last_1h
FROM attempt_counts
WHERE outcome = 'delivered' AND minute >= date_trunc('minute', now()) - interval '59 minutes';

-- name: live_workers
-- A live worker: not stopped, seen in the last 30 seconds (its heartbeat runs every 5).
SELECT worker_id, hostname, pid, started_at, last_seen_at, in_flight, delivered, failed
FROM worker_heartbeats
WHERE stopped_at IS NULL AND last_seen_at > now() - interval '30 seconds'
ORDER BY worker_id;

-- name: endpoint_health
-- Per endpoint: paused or not, and its last success, judged from the attempts of
-- its latest 200 effects (the failing streak and the rest come from its budget,
-- core/endpoint_state.sql, as the claim reads them): bounded work per endpoint
-- (ix_effects_endpoint_created_at_id, then one ix_delivery_attempts_effect_id_attempt
-- probe per effect: the LIMIT keeps the LATERAL a nested loop, never a scan of all
-- attempts), whatever the other endpoints' traffic.
SELECT ep.name, ep.kind, ep.enabled, ep.paused_reason, ep.paused_at,
       h.last_delivered_at
FROM endpoints ep
LEFT JOIN LATERAL (
    WITH recent_effects AS (
        SELECT f.id FROM visible_effects f
        WHERE f.endpoint = ep.name
        ORDER BY f.created_at DESC, f.id DESC
        LIMIT 200
    ), recent AS (
        SELECT a.outcome, a.started_at
        FROM recent_effects r
        CROSS JOIN LATERAL (
            SELECT outcome, started_at FROM delivery_attempts
            WHERE effect_id = r.id
            ORDER BY attempt DESC
            LIMIT 50
        ) a
    ), last_ok AS (
        SELECT max(started_at) AS at FROM recent WHERE outcome = 'delivered'
    )
    SELECT (SELECT at FROM last_ok) AS last_delivered_at
) h ON true
ORDER BY ep.name;

-- name: last_batch_per_job
-- The newest committed batch of every job: one descent of ix_batches_job_committed_at
-- per job (a loose index scan), so the markers of years of batches are never read.
WITH RECURSIVE jobs(job) AS (
    SELECT min(job) FROM batches
    UNION ALL
    SELECT (SELECT min(b.job) FROM batches b WHERE b.job > j.job)
    FROM jobs j WHERE j.job IS NOT NULL
)
SELECT l.job, l.batch_id, l.committed_at, l.effects_new, l.rejects
FROM jobs j
CROSS JOIN LATERAL (
    SELECT b.job, b.batch_id, b.committed_at, b.effects_new, b.rejects
    FROM batches b
    WHERE b.job = j.job
    ORDER BY b.committed_at DESC
    LIMIT 1
) l
ORDER BY l.job;

-- name: attempts_per_minute
-- The status chart: delivered and failed attempts per minute over the last :hours
-- hours, from the kept attempt counts (a range of ix_attempt_counts_minute: at most
-- a row per minute and outcome once folded).
SELECT minute,
       CAST(COALESCE(sum(n) FILTER (WHERE outcome = 'delivered'), 0) AS bigint) AS delivered,
       CAST(COALESCE(sum(n) FILTER (WHERE outcome IN ('retry', 'dead', 'gone')), 0) AS bigint)
           AS failed
FROM attempt_counts
WHERE minute >= date_trunc('minute', now()) - make_interval(hours => :hours)
GROUP BY 1
ORDER BY 1;

-- name: this_minute
-- The chart's right edge, on the database's clock (the attempts' clock).
SELECT date_trunc('minute', now());

-- name: recent_mismatches
-- Batches of the last 24 h that met stored keys with another payload: a re-run
-- that computed different content (ix_batches_committed_at_mismatched).
SELECT job, batch_id, committed_at, payload_mismatches
FROM batches
WHERE payload_mismatches > 0 AND committed_at > now() - interval '24 hours'
ORDER BY committed_at DESC
LIMIT 20;

-- name: mismatch_total
-- /metrics: payload mismatches of the last 24 h, the sink's batches'
-- (ix_batches_committed_at_mismatched) and enqueue()'s (ix_enqueue_mismatches_at).
SELECT (SELECT COALESCE(sum(payload_mismatches), 0) FROM batches
        WHERE payload_mismatches > 0 AND committed_at > now() - interval '24 hours')
     + (SELECT count(*) FROM enqueue_mismatches WHERE at > now() - interval '24 hours');

-- name: recent_enqueue_mismatches
-- enqueue()'s payload mismatches of the last 24 h, newest first (ix_enqueue_mismatches_at).
SELECT idempotency_key, endpoint, at
FROM enqueue_mismatches
WHERE at > now() - interval '24 hours'
ORDER BY at DESC, id DESC
LIMIT 20;

-- name: expired_total
-- /metrics: effects that expired unsent in the last 24 h (ix_effects_expired: a
-- range of recent expirations, however long the history).
SELECT count(*) FROM effects
WHERE state = 'expired' AND purged_at IS NULL AND updated_at > now() - interval '24 hours';
