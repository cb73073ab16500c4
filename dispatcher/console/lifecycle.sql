-- name: lock_endpoint
-- Archive and unarchive read and change the endpoint under its row lock.
SELECT id FROM endpoints WHERE name = :name FOR UPDATE;

-- name: count_unfinished
-- What would be stranded by the archive; one range of ix_effects_due. Invisible
-- rows (a run not committed) are left out, as everywhere: they do not exist yet.
SELECT count(*) FILTER (WHERE state = 'pending'), count(*) FILTER (WHERE state = 'leased')
FROM visible_effects
WHERE endpoint = :name AND state IN ('pending', 'leased');

-- name: cancel_pending_of_endpoint
-- --cancel-pending: the endpoint's pending effects end 'cancelled' with the archive
-- (as `outbox effects cancel` would end each); leased ones are not touched.
UPDATE effects
SET state = 'cancelled', lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
    updated_at = now()
WHERE id IN (SELECT id FROM visible_effects WHERE endpoint = :name AND state = 'pending')
RETURNING id;

-- name: archive_endpoint
-- Archived and paused: the claim skips paused endpoints (due.sql, ready_effects), so
-- no dispatcher sends for it. A pause already in place keeps its reason.
UPDATE endpoints
SET archived_at = now(), archived_reason = :reason, enabled = false,
    paused_reason = CASE WHEN enabled THEN 'archived' ELSE paused_reason END,
    paused_at = CASE WHEN enabled THEN now() ELSE paused_at END,
    updated_at = now()
WHERE name = :name;

-- name: unarchive_endpoint
-- Back to the state before the archive: enabled if the archive paused it, else
-- still paused with the earlier reason.
UPDATE endpoints
SET archived_at = NULL, archived_reason = NULL,
    enabled = enabled OR COALESCE(paused_reason = 'archived', false),
    paused_at = CASE WHEN paused_reason = 'archived' THEN NULL ELSE paused_at END,
    paused_reason = NULLIF(paused_reason, 'archived'),
    updated_at = now()
WHERE name = :name;
