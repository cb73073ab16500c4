-- The preview's executor statement (spark_jobs/spark/preview_tasks.py), on a read-only connection.

-- name: stored_keys
-- What a chunk's keys already name: a visible effect (its state, hash, payload),
-- else the key ledger (a finished key whose effect retention purged).
SELECT v.idempotency_key, v.state, v.payload_sha256, CAST(v.payload AS text)
FROM visible_effects v WHERE v.idempotency_key = ANY(%(keys)s)
UNION ALL
SELECT l.idempotency_key, l.state || ' (purged)', l.payload_sha256, NULL
FROM key_ledger l
WHERE l.idempotency_key = ANY(%(keys)s)
  AND NOT EXISTS (SELECT 1 FROM visible_effects v WHERE v.idempotency_key = l.idempotency_key);
