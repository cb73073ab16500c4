-- Resend on request (spark_outbox.console.resend): an operator sends a delivered or
-- dead effect again, same key. The filter parameters are filters.EffectFilter's;
-- absent ones are NULL and folded away at planning (the driver sends literals), so
-- the filter's own index serves (tests/api/test_audit_plans.py).

-- name: resend_candidate
-- One effect, locked, with what decides whether it may be sent again: its state,
-- its payload's fate (purged by retention, or erased: last_error holds the
-- erasure's note) and its endpoint's (archived, paused).
SELECT e.id, e.state, e.endpoint, e.purged_at, e.last_error,
       ep.name IS NOT NULL AS registered, ep.archived_at, COALESCE(ep.enabled, false) AS enabled,
       CASE WHEN e.expires_at <= now() THEN e.expires_at END AS send_by_passed
FROM effects e
LEFT JOIN endpoints ep ON ep.name = e.endpoint
WHERE e.idempotency_key = :key
  AND (e.run_id IS NULL OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id))
FOR UPDATE OF e;

-- name: count_resendable
-- The bulk resend's count (and its dry run): the delivered and dead effects the
-- filter matches that can be sent again, up to cap + 1 of them, and how many of
-- those wait for a paused endpoint's resume.
SELECT count(*) AS n, count(*) FILTER (WHERE NOT m.enabled) AS paused
FROM (
    SELECT ep.enabled
    FROM visible_effects e
    JOIN endpoints ep ON ep.name = e.endpoint AND ep.archived_at IS NULL
    WHERE e.state IN ('delivered', 'dead') AND e.purged_at IS NULL
      AND (e.expires_at IS NULL OR e.expires_at > now())
      AND (CAST(:state AS text) IS NULL OR e.state = :state)
      AND (CAST(:since AS timestamptz) IS NULL OR e.created_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR e.created_at < :until)
      AND (CAST(:job AS text) IS NULL OR e.job = :job)
      AND (CAST(:batch_id AS text) IS NULL OR e.batch_id = :batch_id)
      AND (CAST(:endpoint AS text) IS NULL OR e.endpoint = :endpoint)
      AND (CAST(:recipient AS text) IS NULL OR e.recipient = :recipient)
      AND (CAST(:reference AS text) IS NULL OR e.reference = :reference)
    LIMIT :cap_plus_one
) m;

-- name: count_refused
-- ... and the ones that cannot, by reason, up to :scan_limit of them: the payload
-- is gone (erased: last_error holds the erasure's note; or purged by retention),
-- the endpoint is archived or no longer registered, or the effect's send-by time
-- has passed (sent again, it would only expire: docs/operations.md, "Send-by times").
SELECT m.why, count(*) AS n
FROM (
    SELECT CASE WHEN e.purged_at IS NOT NULL AND starts_with(e.last_error, :erased_note)
                    THEN 'erased'
                WHEN e.purged_at IS NOT NULL THEN 'purged'
                WHEN ep.name IS NULL THEN 'unregistered endpoint'
                WHEN ep.archived_at IS NOT NULL THEN 'archived endpoint'
                ELSE 'past its send-by time' END AS why
    FROM visible_effects e
    LEFT JOIN endpoints ep ON ep.name = e.endpoint
    WHERE e.state IN ('delivered', 'dead')
      AND (e.purged_at IS NOT NULL OR ep.name IS NULL OR ep.archived_at IS NOT NULL
           OR e.expires_at <= now())
      AND (CAST(:state AS text) IS NULL OR e.state = :state)
      AND (CAST(:since AS timestamptz) IS NULL OR e.created_at >= :since)
      AND (CAST(:until AS timestamptz) IS NULL OR e.created_at < :until)
      AND (CAST(:job AS text) IS NULL OR e.job = :job)
      AND (CAST(:batch_id AS text) IS NULL OR e.batch_id = :batch_id)
      AND (CAST(:endpoint AS text) IS NULL OR e.endpoint = :endpoint)
      AND (CAST(:recipient AS text) IS NULL OR e.recipient = :recipient)
      AND (CAST(:reference AS text) IS NULL OR e.reference = :reference)
    LIMIT :scan_limit
) m
GROUP BY m.why;

-- name: lock_resendable
-- The bulk resend itself: the effects the filter matches that can be sent again,
-- locked (up to cap + 1: more refuses the whole resend), so the action's record
-- can name them before they change.
SELECT e.id, e.idempotency_key
FROM effects e
JOIN endpoints ep ON ep.name = e.endpoint AND ep.archived_at IS NULL
WHERE e.state IN ('delivered', 'dead') AND e.purged_at IS NULL
  AND (e.expires_at IS NULL OR e.expires_at > now())
  AND (e.run_id IS NULL OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id))
  AND (CAST(:state AS text) IS NULL OR e.state = :state)
  AND (CAST(:since AS timestamptz) IS NULL OR e.created_at >= :since)
  AND (CAST(:until AS timestamptz) IS NULL OR e.created_at < :until)
  AND (CAST(:job AS text) IS NULL OR e.job = :job)
  AND (CAST(:batch_id AS text) IS NULL OR e.batch_id = :batch_id)
  AND (CAST(:endpoint AS text) IS NULL OR e.endpoint = :endpoint)
  AND (CAST(:recipient AS text) IS NULL OR e.recipient = :recipient)
  AND (CAST(:reference AS text) IS NULL OR e.reference = :reference)
LIMIT :cap_plus_one
FOR UPDATE OF e;

-- name: resend_ids
-- Send them again: pending, due now, tagged with the operator's action; their
-- attempts and history stay. (Locked by the caller, still delivered or dead.)
UPDATE effects
SET state = 'pending', next_attempt_at = now(), resend_action_id = :action_id,
    lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, send_started_at = NULL,
    updated_at = now()
WHERE id = ANY(CAST(:ids AS bigint[])) AND state IN ('delivered', 'dead')
RETURNING id;

-- name: ledger_entry
-- A key whose effect row is gone is still known to the ledger (how and when it finished).
SELECT endpoint, state, COALESCE(delivered_at, finished_at) AS finished_at
FROM key_ledger
WHERE idempotency_key = :key;
