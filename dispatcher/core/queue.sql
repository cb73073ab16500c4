-- name: queue_stats
-- The queue: effects due now (via ix_effects_due) and how long the oldest of them
-- has been due, per endpoint. The same figures in the worker's metrics, the API's
-- metrics and /v1/status. Ready, not claimable (migration 1104): an ordered endpoint's
-- effects that wait behind an earlier one of their key are parked within a second
-- (dispatch/store.sql, park_blocked) and count here until then. With the ordering probe, a
-- count while 29,000 waited unparked took 5-7 s, and the snapshot it held kept
-- PostgreSQL from discarding the dead index entries every claim then walked
-- (bench/RESULTS.md, "ordered endpoints parked").
-- At most :cap due effects are read (queue.py: beyond, the snapshot below).
SELECT d.endpoint, count(*) AS depth,
       COALESCE(EXTRACT(EPOCH FROM now() - min(d.next_attempt_at)), 0) AS oldest_due_age_s
FROM (SELECT e.endpoint, e.next_attempt_at
      FROM ready_effects e
      WHERE e.next_attempt_at <= now()
      LIMIT :cap) d
GROUP BY d.endpoint;

-- name: refresh_snapshot
-- The full count (the figures above, every due effect), written as the snapshot:
-- only when the one there is older than :refresh_after_s (or there is none), and
-- by one reader at a time (the advisory lock, taken with try, is the turn; a
-- reader without it reads the snapshot there). Returns nothing when it was not
-- this reader's turn. The count is skipped, not filtered, when it is not (the
-- turn is a one-time filter above the scan).
WITH turn AS (
    SELECT 1 AS mine
    WHERE NOT EXISTS (SELECT 1 FROM queue_snapshot s
                      WHERE s.taken_at > now() - make_interval(secs => :refresh_after_s))
      AND pg_try_advisory_xact_lock(:lock_key)
), counted AS (
    SELECT e.endpoint, count(*) AS depth,
           EXTRACT(EPOCH FROM now() - min(e.next_attempt_at)) AS oldest_due_age_s
    FROM ready_effects e
    WHERE e.next_attempt_at <= now() AND EXISTS (SELECT 1 FROM turn)
    GROUP BY e.endpoint
)
INSERT INTO queue_snapshot (id, figures, taken_at)
SELECT 1, COALESCE(jsonb_object_agg(c.endpoint, jsonb_build_array(c.depth, c.oldest_due_age_s)),
                   '{}'),
       now()
FROM counted c
HAVING EXISTS (SELECT 1 FROM turn)
ON CONFLICT (id) DO UPDATE SET figures = EXCLUDED.figures, taken_at = EXCLUDED.taken_at
RETURNING figures, taken_at;

-- name: count_all
-- The full count, not written (queue.py: no snapshot young enough, and another
-- reader's count under way).
SELECT e.endpoint, count(*) AS depth,
       EXTRACT(EPOCH FROM now() - min(e.next_attempt_at)) AS oldest_due_age_s
FROM ready_effects e
WHERE e.next_attempt_at <= now()
GROUP BY e.endpoint;

-- name: read_only
-- A read-only transaction (a standby, default_transaction_read_only) cannot take
-- the snapshot: it reads it, or counts.
SELECT current_setting('transaction_read_only') = 'on';

-- name: snapshot
-- The snapshot, if it is younger than :max_age_s.
SELECT figures, taken_at FROM queue_snapshot
WHERE id = 1 AND taken_at > now() - make_interval(secs => :max_age_s);

-- name: without_jit
-- JIT off for the rest of this transaction (a no-op on an autocommit connection,
-- whose sessions set it already: the dispatcher's): the count above is priced far
-- above jit_above_cost (its hashed subplans), and beside 1,000,000 due effects
-- compiling it took 329 ms of a 568 ms count (441-494 ms against 204-234 ms
-- without; every /v1/status and scrape). Transaction-local, not a connection
-- option: PgBouncer refuses those.
SELECT set_config('jit', 'off', true);
