-- name: endpoint_for_update
-- An update reads the current values under a row lock, so the audit's "old" is
-- exactly what the update replaced.
SELECT * FROM endpoints WHERE name = :name FOR UPDATE;

-- name: update_endpoint_settings
-- Every setting but the signing secret; the dispatchers pick it up within their
-- endpoint cache (2 s).
UPDATE endpoints
SET url = :url, timeout_s = :timeout_s, retry_schedule_s = :retry_schedule_s,
    rate_limit_per_s = :rate_limit_per_s, max_in_flight = :max_in_flight, ordered = :ordered,
    deduplicates = :deduplicates, smtp_host = :smtp_host, smtp_port = :smtp_port,
    smtp_tls = :smtp_tls, smtp_username = :smtp_username, smtp_password = :smtp_password,
    mail_from = :mail_from, smtp_allow_plaintext_auth = :smtp_allow_plaintext_auth,
    updated_at = now()
WHERE name = :name;

-- name: unpark_unordered
-- An endpoint no longer ordered: its effects parked behind an earlier one of their
-- key (store.sql, park_blocked) are due at once (not a held batch's: a release
-- makes those due). One range of ix_effects_due.
UPDATE effects e SET next_attempt_at = now()
WHERE e.endpoint = :name AND e.state = 'pending' AND e.next_attempt_at = 'infinity'
  AND e.ordering_key IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id AND b.hold_state = 'held');

-- name: prune_secrets
-- A rotation forgets the earlier secrets whose overlap has ended (they sign no more).
DELETE FROM endpoint_secrets WHERE endpoint_id = :endpoint_id AND not_after <= now();

-- name: drop_older_secrets
-- A rotation without overlap (a leaked secret): every earlier secret stops at once.
DELETE FROM endpoint_secrets WHERE endpoint_id = :endpoint_id;

-- name: keep_previous_secret
-- A rotation inside a running overlap: the previous secret, about to be displaced
-- by the current one, keeps signing until its own overlap ends.
INSERT INTO endpoint_secrets (endpoint_id, secret, not_after)
SELECT id, previous_signing_secret, previous_secret_expires_at
FROM endpoints
WHERE id = :endpoint_id AND previous_signing_secret IS NOT NULL
  AND previous_secret_expires_at > now();

-- name: rotate_secret
-- The current secret becomes the previous one, signing beside the new one until
-- the overlap ends (no overlap: it is dropped at once).
UPDATE endpoints
SET previous_signing_secret = CASE WHEN :overlap_s > 0 THEN signing_secret END,
    previous_secret_expires_at = CASE WHEN :overlap_s > 0
                                      THEN now() + make_interval(secs => :overlap_s) END,
    signing_secret = :secret, updated_at = now()
WHERE id = :endpoint_id AND kind = 'webhook'
RETURNING previous_secret_expires_at;
