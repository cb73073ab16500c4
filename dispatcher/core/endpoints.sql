-- name: insert_endpoint
-- Register a destination; the name is what producers use, never the URL.
INSERT INTO endpoints (name, kind, url, signing_secret, smtp_host, smtp_port, smtp_tls,
                       smtp_username, smtp_password, smtp_allow_plaintext_auth, mail_from,
                       timeout_s, retry_schedule_s, rate_limit_per_s, max_in_flight, ordered,
                       deduplicates)
VALUES (:name, :kind, :url, :signing_secret, :smtp_host, :smtp_port, :smtp_tls,
        :smtp_username, :smtp_password, :smtp_allow_plaintext_auth, :mail_from, :timeout_s,
        :retry_schedule_s, :rate_limit_per_s, :max_in_flight, :ordered, :deduplicates)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: select_endpoints
-- Every endpoint, by name (a handful of rows), with the rest its dispatchers share
-- and the secrets of earlier rotations still overlapping (ix_endpoint_secrets_endpoint_id).
SELECT ep.*, b.resting_until,
       ARRAY(SELECT s.secret FROM endpoint_secrets s
             WHERE s.endpoint_id = ep.id AND s.not_after > now() ORDER BY s.id) AS older_secrets,
       ARRAY(SELECT s.not_after FROM endpoint_secrets s
             WHERE s.endpoint_id = ep.id AND s.not_after > now() ORDER BY s.id) AS older_not_after
FROM endpoints ep LEFT JOIN endpoint_budgets b ON b.endpoint = ep.name
ORDER BY ep.name;

-- name: select_endpoint
SELECT ep.*, b.resting_until,
       ARRAY(SELECT s.secret FROM endpoint_secrets s
             WHERE s.endpoint_id = ep.id AND s.not_after > now() ORDER BY s.id) AS older_secrets,
       ARRAY(SELECT s.not_after FROM endpoint_secrets s
             WHERE s.endpoint_id = ep.id AND s.not_after > now() ORDER BY s.id) AS older_not_after
FROM endpoints ep LEFT JOIN endpoint_budgets b ON b.endpoint = ep.name
WHERE ep.name = :name;

-- name: pause_endpoint
-- A paused endpoint keeps its effects pending; the dispatcher skips it.
UPDATE endpoints SET enabled = false, paused_reason = :reason, paused_at = now(), updated_at = now()
WHERE name = :name
RETURNING id;

-- name: resume_endpoint
-- Resuming makes the endpoint's due effects claimable again at once (not an archived
-- one's: it is unarchived first).
UPDATE endpoints SET enabled = true, paused_reason = NULL, paused_at = NULL, updated_at = now()
WHERE name = :name AND archived_at IS NULL
RETURNING id;

-- name: reset_budget
-- After a resume or a change of limits: no failing streak, no rest, and the
-- leased count taken afresh from the effects (ix_effects_due's endpoint range).
INSERT INTO endpoint_budgets (endpoint, in_flight)
SELECT :name, count(*) FROM effects WHERE endpoint = :name AND state = 'leased'
ON CONFLICT (endpoint) DO UPDATE SET
    in_flight = EXCLUDED.in_flight, failures = 0, failing_since = NULL, resting_until = NULL;
