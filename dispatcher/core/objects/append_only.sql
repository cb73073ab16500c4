-- Tables whose rows are history: written once, never changed. The operator audit
-- trail (operator_actions: who did what to which effect or endpoint, and why) is
-- one; a row that could be rewritten would prove nothing.

-- name: outbox_refuse_change
-- Refuses the statement it fires for, naming the table and the operation, with
-- the error code of a refused privilege: a rewrite is not allowed, not broken.
CREATE OR REPLACE FUNCTION outbox_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;

-- name: operator_actions_append_only
-- The operator audit trail refuses UPDATE and DELETE, whoever connects.
-- Dropped and created, not CREATE OR REPLACE TRIGGER: that needs PostgreSQL 14,
-- and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS operator_actions_append_only ON operator_actions;
CREATE TRIGGER operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions
FOR EACH ROW EXECUTE FUNCTION outbox_refuse_change();
