-- name: endpoint_kind
-- Producers name endpoints; an unknown name is refused before anything is written,
-- and so is an archived one; the kind says which channel's contract the effect must
-- meet (e-mail).
SELECT kind, archived_at IS NOT NULL AS archived FROM endpoints WHERE name = :endpoint;

-- name: insert_effect
-- Idempotent on the key: a second enqueue of the same key inserts nothing and
-- returns nothing, so the caller learns whether the effect is new. A key in the
-- key ledger (delivered, or dead/cancelled and purged) is never enqueued again.
INSERT INTO effects (idempotency_key, endpoint, recipient, payload, payload_sha256,
                     ordering_key, reference, supersedes, next_attempt_at, expires_at,
                     trace_parent, trace_state)
SELECT :idempotency_key, :endpoint, :recipient, CAST(:payload AS jsonb), :payload_sha256,
       :ordering_key, :reference, :supersedes, COALESCE(:not_before, now()),
       CAST(:expires_at AS timestamptz), :trace_parent, :trace_state
WHERE NOT EXISTS (SELECT 1 FROM key_ledger WHERE idempotency_key = :idempotency_key)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: held_by_invisible
-- Cheap test before taking the lock: is the key held by a row nobody can see yet?
SELECT 1 FROM effects e
WHERE e.idempotency_key = :idempotency_key
  AND NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.idempotency_key = :idempotency_key);

-- name: take_visibility_lock
-- The lock the sink's commits take for their final step: while it is held, no
-- run's marker commits, so "this row is invisible" stays true until we commit.
SELECT pg_advisory_xact_lock(:lock_id);

-- name: take_over_invisible
-- A key held only by a row of a run that has not committed (dead, or in flight)
-- must not swallow this enqueue: the row becomes this effect. If its run commits
-- later, the row is simply no longer its own (the run's counts say so).
UPDATE effects e
SET run_id = NULL, job = NULL, batch_id = NULL, endpoint = :endpoint, recipient = :recipient,
    payload = CAST(:payload AS jsonb), payload_sha256 = :payload_sha256,
    ordering_key = :ordering_key, reference = :reference, supersedes = :supersedes,
    next_attempt_at = COALESCE(:not_before, now()), expires_at = CAST(:expires_at AS timestamptz),
    created_at = now(), updated_at = now(),
    trace_parent = :trace_parent, trace_state = :trace_state
WHERE e.idempotency_key = :idempotency_key
  AND NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.idempotency_key = :idempotency_key)
RETURNING id;

-- name: stored_payload_sha256
-- For an existing key: the stored payload's hash (from the ledger if purged).
SELECT payload_sha256 FROM effects WHERE idempotency_key = :idempotency_key
UNION ALL
SELECT payload_sha256 FROM key_ledger WHERE idempotency_key = :idempotency_key
LIMIT 1;

-- name: record_mismatch
-- The key was known with another payload: the first payload stays, and the event
-- is kept for /v1/status and /metrics (migration 1809), in the caller's transaction.
INSERT INTO enqueue_mismatches (idempotency_key, endpoint, stored_sha256, offered_sha256)
VALUES (:idempotency_key, :endpoint, :stored_sha256, :offered_sha256);
