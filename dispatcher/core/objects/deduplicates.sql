-- An endpoint "deduplicates" when its receiver honours the idempotency key
-- (docs/design.md glossary; docs/dispatcher.md, "Uncertain sends"): a send to one
-- that does not is marked started first and, if its outcome is lost, becomes
-- uncertain instead of being sent again.

-- name: endpoint_deduplicates_default
-- The kind's default when an insert leaves deduplicates out (webhook: true,
-- e-mail: false), so no writer can give an e-mail endpoint the webhook's; the
-- column is NOT NULL with no server default because the default depends on kind.
CREATE OR REPLACE FUNCTION endpoint_deduplicates_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.deduplicates IS NULL THEN
        NEW.deduplicates := NEW.kind = 'webhook';
    END IF;
    RETURN NEW;
END $$;

-- name: endpoints_deduplicates_default
-- Before the insert, so the NOT NULL check sees the default.
-- Dropped and created, not CREATE OR REPLACE TRIGGER: that needs PostgreSQL 14,
-- and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS endpoints_deduplicates_default ON endpoints;
CREATE TRIGGER endpoints_deduplicates_default BEFORE INSERT ON endpoints
FOR EACH ROW EXECUTE FUNCTION endpoint_deduplicates_default();
