-- Uncertain effects (docs/dispatcher.md, "Uncertain sends"): listed, and resolved
-- by an operator: marked delivered, or sent again.

-- name: uncertain_effects
-- The support page and `outbox effects uncertain`: oldest first (ix_effects_state_created_at_id).
SELECT e.idempotency_key, e.endpoint, e.recipient, e.reference, e.attempt_count,
       e.send_started_at, e.updated_at, e.last_error, e.created_at, e.payload
FROM visible_effects e
WHERE e.state = 'uncertain'
ORDER BY e.created_at, e.id
LIMIT :limit;

-- name: uncertain_state
-- A resolve's check (and its dry run): the effect's state, its row locked so a
-- concurrent resolve of the same effect waits and then finds it resolved.
SELECT e.state, e.endpoint, CASE WHEN e.expires_at <= now() THEN e.expires_at END AS send_by_passed
FROM effects e
WHERE e.idempotency_key = :key
  AND (e.run_id IS NULL OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id))
FOR UPDATE OF e;

-- name: mark_delivered
-- The operator confirmed the receiver has it: delivered, and the key ledger keeps
-- the operator's word for it (no delivered attempt records it: reconciliation
-- reads it there, and it stays after the row is purged)
WITH done AS (
    UPDATE effects SET state = 'delivered', delivered_at = now(), send_started_at = NULL,
                       last_error = 'marked delivered by an operator after an uncertain send',
                       updated_at = now()
    WHERE idempotency_key = ANY(CAST(:keys AS text[])) AND state = 'uncertain'
    RETURNING idempotency_key, endpoint, payload_sha256
), ledger AS (
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at)
    SELECT idempotency_key, endpoint, payload_sha256, now() FROM done
    ON CONFLICT (idempotency_key) DO NOTHING
)
SELECT idempotency_key FROM done;

-- name: send_again
-- The operator decided to send it once more: pending, due now, its start cleared.
-- (Not past its send-by time: uncertain.resolve refuses that one, and a bulk
-- resolve leaves it uncertain: uncertain_of_endpoint.)
UPDATE effects SET state = 'pending', next_attempt_at = now(), send_started_at = NULL,
                   lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                   last_error = 'sent again by an operator after an uncertain send',
                   updated_at = now()
WHERE idempotency_key = ANY(CAST(:keys AS text[])) AND state = 'uncertain'
RETURNING idempotency_key;

-- name: uncertain_of_endpoint
-- A bulk resolve: the endpoint's uncertain effects, locked, up to cap + 1. (An
-- uncertain effect was claimed, so its batch is visible: no view needed.) Sent
-- again only while their send-by time is ahead; past it they stay uncertain.
SELECT idempotency_key FROM effects
WHERE state = 'uncertain' AND endpoint = :endpoint
  AND (:action <> 'send_again' OR expires_at IS NULL OR expires_at > now())
ORDER BY created_at, id
LIMIT :cap_plus_one
FOR UPDATE;

-- name: uncertain_count
-- /metrics and the status line (ix_effects_state_created_at_id).
SELECT count(*) FROM visible_effects WHERE state = 'uncertain';
