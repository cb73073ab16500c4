-- name: insert_token
-- Only the sha256 of the token is stored; the plaintext is shown once, at creation.
INSERT INTO api_tokens (name, role, token_sha256)
VALUES (:name, :role, :token_sha256)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, role, created_at, last_used_at, revoked_at;

-- name: token_by_hash
-- Authentication: one lookup on the unique hash index; revoked tokens match nothing.
SELECT id, name, role, created_at, last_used_at, revoked_at
FROM api_tokens
WHERE token_sha256 = :token_sha256 AND revoked_at IS NULL;

-- name: touch_token
-- last_used_at at minute precision: at most one write a minute per token, not one per request.
UPDATE api_tokens SET last_used_at = now()
WHERE id = :id AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute');

-- name: select_tokens
SELECT id, name, role, created_at, last_used_at, revoked_at FROM api_tokens ORDER BY name;

-- name: revoke_token
-- Revoked, not deleted: the row stays as a record of who had access.
UPDATE api_tokens SET revoked_at = now()
WHERE name = :name AND revoked_at IS NULL
RETURNING id;
