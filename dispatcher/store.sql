-- name: claim
-- Lease up to :limit due effects (first claims and expired leases alike; the
-- due_effects view is the one definition of "due", read in ix_effects_due
-- order); SKIP LOCKED lets any number of workers claim side by side. A key
-- already in the key ledger is marked delivered here instead of leased: never
-- sent twice by us. The dispatcher's connections keep this on ix_effects_due
-- (store.ENGINE_OPTIONS).
WITH due AS (
    SELECT e.id, e.idempotency_key
    FROM due_effects e
    ORDER BY e.next_attempt_at
    LIMIT :limit
    FOR UPDATE OF e SKIP LOCKED
), known AS MATERIALIZED (
    -- One probe of the ledger's key index per claimed row: a join here let the
    -- planner hash the whole ledger on every claim (O(ledger) per claim).
    SELECT due.id, (SELECT k.delivered_at FROM key_ledger k
                    WHERE k.idempotency_key = due.idempotency_key
                      AND k.state = 'delivered') AS delivered_at
    FROM due
)
UPDATE effects e SET
    state = CASE WHEN known.delivered_at IS NULL THEN 'leased' ELSE 'delivered' END,
    lease_owner = CASE WHEN known.delivered_at IS NULL THEN :worker_id END,
    lease_token = CASE WHEN known.delivered_at IS NULL THEN gen_random_uuid() END,
    lease_expires_at = CASE WHEN known.delivered_at IS NULL
                            THEN now() + make_interval(secs => :lease_s) END,
    next_attempt_at = CASE WHEN known.delivered_at IS NULL
                           THEN now() + make_interval(secs => :lease_s)
                           ELSE e.next_attempt_at END,
    attempt_count = e.attempt_count + CASE WHEN known.delivered_at IS NULL THEN 1 ELSE 0 END,
    delivered_at = COALESCE(known.delivered_at, e.delivered_at),
    last_error = CASE WHEN known.delivered_at IS NULL THEN e.last_error
                      ELSE 'already delivered (key ledger): not sent again' END,
    updated_at = now()
FROM known
WHERE e.id = known.id
RETURNING e.id, e.idempotency_key, e.endpoint, e.recipient, CAST(e.payload AS text) AS payload,
          e.attempt_count, CAST(e.lease_token AS text) AS lease_token, e.created_at,
          known.delivered_at IS NOT NULL AS already_delivered;

-- name: durable_commit
-- Outcomes and the key ledger are durable at COMMIT, even on a session that
-- commits claims asynchronously (store.ENGINE_OPTIONS).
SET LOCAL synchronous_commit = on;

-- name: record
-- Record a batch of attempt outcomes in one statement: every row is fenced by
-- its lease token (a worker that lost its lease changes nothing on the effect;
-- its attempt is logged as 'stale'); a delivery writes the key ledger in the
-- same transaction; a 410 pauses the endpoint.
WITH r AS (
    SELECT *
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]), CAST(:outcomes AS text[]),
                CAST(:delays_s AS float8[]), CAST(:errors AS text[]),
                CAST(:status_codes AS int[]), CAST(:error_classes AS text[]),
                CAST(:excerpts AS text[]), CAST(:started_at AS timestamptz[]),
                CAST(:durations_ms AS float8[]), CAST(:attempts AS int[]))
         AS r(id, token, outcome, delay_s, error, status_code, error_class, excerpt,
              started_at, duration_ms, attempt)
), updated AS (
    UPDATE effects e SET
        state = CASE r.outcome WHEN 'delivered' THEN 'delivered'
                               WHEN 'retry' THEN 'pending' ELSE 'dead' END,
        next_attempt_at = CASE WHEN r.outcome = 'retry'
                               THEN now() + make_interval(secs => r.delay_s)
                               ELSE e.next_attempt_at END,
        delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() ELSE e.delivered_at END,
        last_error = r.error,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM r
    WHERE e.id = r.id AND e.state = 'leased' AND e.lease_token = r.token
    RETURNING e.id, r.token, e.idempotency_key, e.endpoint, e.payload_sha256, r.outcome, r.error
), ledger AS (
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at)
    SELECT idempotency_key, endpoint, payload_sha256, now() FROM updated
    WHERE outcome = 'delivered'
    ON CONFLICT (idempotency_key) DO NOTHING
), paused AS (
    UPDATE endpoints p SET enabled = false, paused_reason = g.reason, paused_at = now(),
                           updated_at = now()
    FROM (SELECT endpoint, min(error) AS reason FROM updated WHERE outcome = 'gone'
          GROUP BY endpoint) g
    WHERE p.name = g.endpoint AND p.enabled
), logged AS (
    INSERT INTO delivery_attempts (effect_id, attempt, worker_id, lease_token, started_at,
                                   duration_ms, outcome, status_code, error_class, error,
                                   response_excerpt)
    SELECT r.id, r.attempt, :worker_id, r.token, r.started_at, r.duration_ms,
           -- a hashed lookup: a join on the CTE planned as a nested loop (O(n^2))
           CASE WHEN (r.id, r.token) IN (SELECT u.id, u.token FROM updated u)
                THEN r.outcome ELSE 'stale' END,
           r.status_code, r.error_class, r.error, r.excerpt
    FROM r
    WHERE EXISTS (SELECT 1 FROM effects e WHERE e.id = r.id)
)
-- (tokens as text: the driver would parse every one into a uuid.UUID and back)
SELECT r.id, CAST(r.token AS text), (r.id, r.token) IN (SELECT u.id, u.token FROM updated u)
FROM r;

-- name: release
-- Hand back leases of claimed-but-unsent effects (shutdown, a paused endpoint,
-- an open circuit breaker): due again after :delays_s, and the attempt that
-- never happened is not counted.
UPDATE effects e SET state = 'pending', next_attempt_at = now() + make_interval(secs => r.delay_s),
                     attempt_count = GREATEST(e.attempt_count - 1, 0),
                     lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                     updated_at = now()
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]), CAST(:delays_s AS float8[]))
     AS r(id, token, delay_s)
WHERE e.id = r.id AND e.state = 'leased' AND e.lease_token = r.token
RETURNING e.id;

-- name: due_soon
-- For --until-idle: is anything claimable due now, or within :within_s?
SELECT EXISTS (
    SELECT 1 FROM claimable_effects e
    WHERE e.next_attempt_at <= now() + make_interval(secs => :within_s)
);

-- name: heartbeat
-- Tell operators (and the API's "live workers") this worker is alive and busy.
INSERT INTO worker_heartbeats (worker_id, hostname, pid, in_flight, delivered, failed)
VALUES (:worker_id, :hostname, :pid, :in_flight, :delivered, :failed)
ON CONFLICT (worker_id) DO UPDATE SET
    last_seen_at = now(), in_flight = EXCLUDED.in_flight,
    delivered = EXCLUDED.delivered, failed = EXCLUDED.failed, stopped_at = NULL;

-- name: heartbeat_stopped
-- A clean exit says so, so the worker is not mistaken for a crashed one.
UPDATE worker_heartbeats SET stopped_at = now(), last_seen_at = now(), in_flight = 0
WHERE worker_id = :worker_id;

