-- A finished key stays known after its effect row is gone: the key ledger
-- (key_ledger) gets it in the transaction that deletes the row, whoever deletes it
-- (retention's purge, an older release's purge, an operator's DELETE). While the
-- row is there, its unique key refuses the key again and its state says how it
-- finished; the ledger is for afterwards. So a delivery writes no ledger row: on a
-- year of history the ledger's key index was a random leaf dirtied per delivery,
-- and on an empty outbox its insert was ~10 us of PostgreSQL a delivery
-- (bench/RESULTS.md, "The key ledger at deletion").

-- name: effect_keys_to_ledger
-- The finished effects a statement deleted, their keys into the ledger with the
-- final state, how they finished (delivered_at for a delivery) and when
-- (updated_at: the ledger's horizon counts from the finish), in key order (the
-- ledger's index is walked once). Rows that never finished (a swept run's, an
-- unsent one an operator deleted) are not keys anybody was promised anything
-- about; a key the ledger has already (an erasure's stub, a delivery an older
-- release recorded there) stays as it is.
CREATE OR REPLACE FUNCTION effect_keys_to_ledger() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, state, delivered_at,
                            finished_at)
    SELECT g.idempotency_key, g.endpoint, g.payload_sha256, g.state,
           CASE WHEN g.state = 'delivered' THEN COALESCE(g.delivered_at, g.updated_at) END,
           g.updated_at
    FROM effects_gone g
    WHERE g.state IN ('delivered', 'dead', 'cancelled', 'expired')
    ORDER BY g.idempotency_key
    ON CONFLICT (idempotency_key) DO NOTHING;
    RETURN NULL;
END $$;

-- name: effects_keys_kept_on_delete
-- Every DELETE of effects, once a statement (its transition table): a purge batch
-- of 1,000 writes the ledger in one INSERT. outbox verify checks it is there and
-- enabled (ledger_guard_off).
DROP TRIGGER IF EXISTS effects_keys_kept_on_delete ON effects;
CREATE TRIGGER effects_keys_kept_on_delete AFTER DELETE ON effects
REFERENCING OLD TABLE AS effects_gone
FOR EACH STATEMENT EXECUTE FUNCTION effect_keys_to_ledger();
