-- name: requeue_dead
-- A dead effect, or an expired one, goes back to pending, due now; its attempts
-- count and the delivery_attempts history stay (docs/design.md, the record
-- protocol). :expires_at (optional) replaces its send-by time; without a send-by
-- time still ahead it is not requeued (it would only expire again, unsent).
UPDATE effects
SET state = 'pending', next_attempt_at = now(), lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, expires_at = COALESCE(CAST(:expires_at AS timestamptz), expires_at),
    updated_at = now()
WHERE idempotency_key = :key AND state IN ('dead', 'expired') AND purged_at IS NULL
  AND COALESCE(CAST(:expires_at AS timestamptz), expires_at, 'infinity') > now()
RETURNING id;

-- name: send_by_passed
-- Why a requeue did not apply to a dead or expired effect: its send-by time, if passed.
SELECT expires_at FROM visible_effects
WHERE idempotency_key = :key AND state IN ('dead', 'expired') AND purged_at IS NULL
  AND expires_at <= now();

-- name: cancel_pending
-- Only a pending effect can be cancelled: a leased one is being sent right now,
-- and an invisible one (its run has not committed) does not exist yet. A resend
-- cancelled before it went out leaves an effect delivered before delivered again.
UPDATE effects
SET state = CASE WHEN resend_action_id IS NOT NULL AND delivered_at IS NOT NULL
                 THEN 'delivered' ELSE 'cancelled' END,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE id = (SELECT id FROM visible_effects WHERE idempotency_key = :key AND state = 'pending')
RETURNING id;

-- name: effect_state
-- Why a transition did not apply: the effect's current state, if it exists.
SELECT CASE WHEN purged_at IS NULL THEN state ELSE state || ' and purged' END
FROM visible_effects WHERE idempotency_key = :key;

-- name: count_dead_matching
-- The bulk requeue's dry run: how many dead effects the filter matches, counted
-- up to cap + 1 so that a huge match costs no more than the cap. Effects past
-- their send-by time are left dead by the bulk actions (one by one, a requeue
-- with a new send-by time sends one).
SELECT count(*) FROM (
    SELECT 1 FROM visible_effects
    WHERE state = 'dead' AND created_at >= :since AND created_at < :until
      AND purged_at IS NULL AND (expires_at IS NULL OR expires_at > now())
      AND (CAST(:job AS text) IS NULL OR job = :job)
      AND (CAST(:batch_id AS text) IS NULL OR batch_id = :batch_id)
      AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
      AND (CAST(:recipient AS text) IS NULL OR recipient = :recipient)
      AND (CAST(:reference AS text) IS NULL OR reference = :reference)
    LIMIT :cap_plus_one
) matching;

-- name: bulk_requeue_dead
-- Requeue every dead effect the filter matches (the caller checked the cap first,
-- in the same transaction, and the rows are locked by this UPDATE).
UPDATE effects
SET state = 'pending', next_attempt_at = now(), lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = now()
WHERE state = 'dead' AND created_at >= :since AND created_at < :until
  AND purged_at IS NULL AND (expires_at IS NULL OR expires_at > now())
  AND (CAST(:job AS text) IS NULL OR job = :job)
  AND (CAST(:batch_id AS text) IS NULL OR batch_id = :batch_id)
  AND (CAST(:endpoint AS text) IS NULL OR endpoint = :endpoint)
  AND (CAST(:recipient AS text) IS NULL OR recipient = :recipient)
      AND (CAST(:reference AS text) IS NULL OR reference = :reference)
RETURNING idempotency_key;

-- name: count_dead_of_endpoint
-- The recover dry run: dead effects of one endpoint that died (updated_at) since
-- :since, purged ones excluded (their payload is gone); counted up to cap + 1
-- (ix_effects_dead_endpoint_updated_at).
SELECT count(*) FROM (
    SELECT 1 FROM effects
    WHERE state = 'dead' AND endpoint = :endpoint AND updated_at >= :since
      AND purged_at IS NULL AND (expires_at IS NULL OR expires_at > now())
    LIMIT :cap_plus_one
) matching;

-- name: recover_dead_of_endpoint
-- "Re-send everything that failed since Tuesday": the endpoint's dead effects
-- since :since back to pending, due now; attempts and their history stay.
UPDATE effects
SET state = 'pending', next_attempt_at = now(), lease_owner = NULL, lease_token = NULL,
    lease_expires_at = NULL, updated_at = now()
WHERE state = 'dead' AND endpoint = :endpoint AND updated_at >= :since AND purged_at IS NULL
  AND (expires_at IS NULL OR expires_at > now())
RETURNING idempotency_key;
