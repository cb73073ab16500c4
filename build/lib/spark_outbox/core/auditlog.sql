-- name: record_action
-- The operators' audit trail; append-only (a trigger refuses UPDATE and DELETE).
INSERT INTO operator_actions (actor, action, target, reason, details)
VALUES (:actor, :action, :target, :reason, CAST(:details AS jsonb))
RETURNING id;
