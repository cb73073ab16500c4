-- name: queue_stats
-- The queue: effects due now (via ix_effects_due) and how long the oldest of them
-- has been due. The same two figures in the worker's metrics, the API's metrics
-- and /v1/status. Ready, not claimable (migration 1104): an ordered endpoint's
-- effects that wait behind an earlier one of their key are parked within a second
-- (dispatch/store.sql, park_blocked) and count here until then. With the ordering probe, a
-- count while 29,000 waited unparked took 5-7 s, and the snapshot it held kept
-- PostgreSQL from discarding the dead index entries every claim then walked
-- (bench/RESULTS.md, "ordered endpoints parked").
SELECT count(*) AS depth,
       COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at)), 0) AS oldest_due_age_s
FROM ready_effects
WHERE next_attempt_at <= now();

-- name: without_jit
-- JIT off for the rest of this transaction (a no-op on an autocommit connection,
-- whose sessions set it already: the dispatcher's): the count above is priced far
-- above jit_above_cost (its hashed subplans), and beside 1,000,000 due effects
-- compiling it took 329 ms of a 568 ms count (441-494 ms against 204-234 ms
-- without; every /v1/status and scrape). Transaction-local, not a connection
-- option: PgBouncer refuses those.
SELECT set_config('jit', 'off', true);
