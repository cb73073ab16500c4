-- name: endpoint_kind
-- Producers name endpoints; an unknown name is refused before anything is written,
-- and the kind says which channel's contract the effect must meet (e-mail).
SELECT kind FROM endpoints WHERE name = :endpoint;

-- name: insert_effect
-- Idempotent on the key: a second enqueue of the same key inserts nothing and
-- returns nothing, so the caller learns whether the effect is new. A key in the
-- key ledger (delivered, or dead/cancelled and purged) is never enqueued again.
INSERT INTO effects (idempotency_key, endpoint, recipient, payload, payload_sha256,
                     ordering_key, reference, next_attempt_at)
SELECT :idempotency_key, :endpoint, :recipient, CAST(:payload AS jsonb), :payload_sha256,
       :ordering_key, :reference, COALESCE(:not_before, now())
WHERE NOT EXISTS (SELECT 1 FROM key_ledger WHERE idempotency_key = :idempotency_key)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: stored_payload_sha256
-- For an existing key: the stored payload's hash (from the ledger if purged).
SELECT payload_sha256 FROM effects WHERE idempotency_key = :idempotency_key
UNION ALL
SELECT payload_sha256 FROM key_ledger WHERE idempotency_key = :idempotency_key
LIMIT 1;
