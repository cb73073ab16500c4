-- An endpoint's budget (endpoint_budgets, docs/design.md glossary): what every
-- dispatcher shares for it (the rate limit's tokens, the leased count behind
-- max_in_flight, the failing streak and the circuit breaker's rest). The claim
-- locks and spends it in its one statement; a limited endpoint without its row
-- would get no share, ever, so every endpoint has one.

-- name: endpoint_budget_row
-- Gives a new endpoint its budget row, whichever code path inserts the endpoint
-- (API, CLI, a test's INSERT): the claim never meets an endpoint without one.
CREATE OR REPLACE FUNCTION endpoint_budget_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO endpoint_budgets (endpoint) VALUES (NEW.name) ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$;

-- name: endpoints_budget_row
-- After the insert: the budget row's foreign key needs the endpoint's row.
-- Dropped and created, not CREATE OR REPLACE TRIGGER: that needs PostgreSQL 14,
-- and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS endpoints_budget_row ON endpoints;
CREATE TRIGGER endpoints_budget_row AFTER INSERT ON endpoints
FOR EACH ROW EXECUTE FUNCTION endpoint_budget_row();
