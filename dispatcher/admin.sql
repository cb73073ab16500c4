-- name: endpoint_for_update
-- An update reads the current values under a row lock, so the audit's "old" is
-- exactly what the update replaced.
SELECT * FROM endpoints WHERE name = :name FOR UPDATE;

-- name: update_endpoint_policy
-- URL and delivery policy; the dispatchers pick it up within their endpoint cache (2 s).
UPDATE endpoints
SET url = :url, timeout_s = :timeout_s, retry_schedule_s = :retry_schedule_s,
    rate_limit_per_s = :rate_limit_per_s, max_in_flight = :max_in_flight, ordered = :ordered,
    deduplicates = :deduplicates, updated_at = now()
WHERE name = :name;

-- name: rotate_secret
-- The current secret becomes the previous one, signing beside the new one until
-- the overlap ends (no overlap: it is dropped at once).
UPDATE endpoints
SET previous_signing_secret = CASE WHEN :overlap_s > 0 THEN signing_secret END,
    previous_secret_expires_at = CASE WHEN :overlap_s > 0
                                      THEN now() + make_interval(secs => :overlap_s) END,
    signing_secret = :secret, updated_at = now()
WHERE name = :name AND kind = 'webhook'
RETURNING previous_secret_expires_at;
