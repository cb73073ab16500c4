-- name: insert_endpoint
-- Register a destination; the name is what producers use, never the URL.
INSERT INTO endpoints (name, kind, url, signing_secret, smtp_host, smtp_port, smtp_tls,
                       smtp_username, smtp_password, smtp_allow_plaintext_auth, mail_from,
                       timeout_s, retry_schedule_s, rate_limit_per_s)
VALUES (:name, :kind, :url, :signing_secret, :smtp_host, :smtp_port, :smtp_tls,
        :smtp_username, :smtp_password, :smtp_allow_plaintext_auth, :mail_from, :timeout_s,
        :retry_schedule_s, :rate_limit_per_s)
ON CONFLICT (name) DO NOTHING
RETURNING id;

-- name: select_endpoints
-- Every endpoint, by name (a handful of rows).
SELECT * FROM endpoints ORDER BY name;

-- name: select_endpoint
SELECT * FROM endpoints WHERE name = :name;

-- name: pause_endpoint
-- A paused endpoint keeps its effects pending; the dispatcher skips it.
UPDATE endpoints SET enabled = false, paused_reason = :reason, paused_at = now(), updated_at = now()
WHERE name = :name
RETURNING id;

-- name: resume_endpoint
-- Resuming makes the endpoint's due effects claimable again at once.
UPDATE endpoints SET enabled = true, paused_reason = NULL, paused_at = NULL, updated_at = now()
WHERE name = :name
RETURNING id;
