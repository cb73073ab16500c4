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
