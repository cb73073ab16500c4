-- name: notify
-- Wakes every listening dispatcher at COMMIT (NOTIFY is transactional: nothing
-- is sent on rollback). The reason is informational.
SELECT pg_notify(:channel, :reason);
