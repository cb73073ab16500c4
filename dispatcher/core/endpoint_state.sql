-- name: endpoint_states
-- Every endpoint with what holds it back now, read from what the claim obeys
-- (dispatch/store.sql, claim): enabled, its budget's rest, in-flight count and
-- tokens (refilled to this moment by the claim's own formula), and the failing
-- streak the record keeps. Two small tables, one row per endpoint.
SELECT ep.name, ep.enabled, ep.paused_reason, ep.archived_at, ep.archived_reason,
       ep.rate_limit_per_s, ep.max_in_flight,
       COALESCE(b.failures, 0) AS failures, b.failing_since, b.last_failure,
       CASE WHEN b.resting_until > now() THEN b.resting_until END AS resting_until,
       COALESCE(b.in_flight, 0) AS in_flight,
       CASE WHEN ep.rate_limit_per_s IS NOT NULL THEN
           LEAST(GREATEST(1.0, ep.rate_limit_per_s),
                 b.tokens + ep.rate_limit_per_s * GREATEST(0.0, EXTRACT(
                     EPOCH FROM clock_timestamp() - b.refilled_at)))
       END AS tokens
FROM endpoints ep
LEFT JOIN endpoint_budgets b ON b.endpoint = ep.name
ORDER BY ep.name;
