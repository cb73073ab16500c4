-- Tables whose rows are history: written once, never changed. The operator audit
-- trail (operator_actions: who did what to which effect or endpoint, and why) is
-- one; a row that could be rewritten would prove nothing. The one exception is an
-- erasure (spark_outbox.console.erasure): it may blank a person's data quoted in
-- a row (its target, reason or details), never who did what when.

-- name: outbox_refuse_change
-- Refuses the statement it fires for, naming the table and the operation, with
-- the error code of a refused privilege: a rewrite is not allowed, not broken.
CREATE OR REPLACE FUNCTION outbox_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- name: outbox_audit_redact_only
-- The audit trail's guard: DELETE is refused; UPDATE only inside an erasure's
-- transaction (it sets outbox.erasure to its own operator_actions id, which must
-- already exist) and only of target, reason and details: id, time, actor and
-- action stay what they were. Anything else is refused as outbox_refuse_change does.
CREATE OR REPLACE FUNCTION outbox_audit_redact_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    erasure text := current_setting('outbox.erasure', true);
BEGIN
    IF TG_OP = 'UPDATE' AND erasure ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT 1 FROM operator_actions a
                   WHERE a.id = CAST(erasure AS bigint) AND a.action = 'erase')
       AND NEW.id = OLD.id AND NEW.at = OLD.at AND NEW.actor = OLD.actor
       AND NEW.action = OLD.action THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- name: operator_actions_append_only
-- The operator audit trail refuses DELETE, and UPDATE but an erasure's redaction,
-- whoever connects. Dropped and created, not CREATE OR REPLACE TRIGGER: that
-- needs PostgreSQL 14, and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS operator_actions_append_only ON operator_actions;
CREATE TRIGGER operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions
FOR EACH ROW EXECUTE FUNCTION outbox_audit_redact_only();
