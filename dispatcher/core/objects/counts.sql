-- "How many effects are in each state" and "how many attempts a minute": kept as
-- they change, not counted when asked.
-- With a year of history a count over effects read every row (4.2 s at 10M for
-- /v1/status, bench/RESULTS.md "history"). Every statement that writes effects
-- adds, in the same transaction, one row per (endpoint, state, run) it changed to
-- effect_counts: rows only ever inserted there, so no two writers wait for each
-- other (no counter row is updated on the record path). A reader sums them; the
-- dispatchers fold them into one row per (endpoint, state, run) every few seconds
-- (spark_outbox.core.counts.fold), so a sum reads a few hundred rows at most.
-- Rows of a run without a marker are effects nobody sees yet: they are counted
-- under their run_id, and a reader counts a run once its marker exists.
-- Statement triggers with transition tables (one trigger per event: PostgreSQL
-- allows no more), so a claim of 500 rows writes two rows here, not 500.

-- name: effect_counts_inserted
-- New effects (enqueue, the sink's COPY and its INSERTs, a takeover's insert).
CREATE OR REPLACE FUNCTION effect_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO effect_counts (endpoint, state, run_id, n)
    SELECT endpoint, state, run_id, count(*) FROM inserted_effects
    GROUP BY endpoint, state, run_id;
    RETURN NULL;
END $$;

-- name: effect_counts_updated
-- Changed effects: each row leaves its (endpoint, state, run) and enters its new
-- one; a statement that changed no state (a lease's send start, a parking) adds
-- nothing.
CREATE OR REPLACE FUNCTION effect_counts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO effect_counts (endpoint, state, run_id, n)
    SELECT endpoint, state, run_id, sum(n) FROM (
        SELECT endpoint, state, run_id, 1 AS n FROM updated_effects
        UNION ALL
        SELECT endpoint, state, run_id, -1 AS n FROM replaced_effects
    ) d
    GROUP BY endpoint, state, run_id
    HAVING sum(n) <> 0;
    RETURN NULL;
END $$;

-- name: effect_counts_deleted
-- Deleted effects (retention, the sweep of a run that can never commit).
CREATE OR REPLACE FUNCTION effect_counts_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO effect_counts (endpoint, state, run_id, n)
    SELECT endpoint, state, run_id, -count(*) FROM deleted_effects
    GROUP BY endpoint, state, run_id;
    RETURN NULL;
END $$;

-- name: effect_counts_truncated
-- An emptied outbox counts nothing (tests and benches truncate it).
CREATE OR REPLACE FUNCTION effect_counts_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM effect_counts;
    RETURN NULL;
END $$;

-- name: effects_count_on_insert
-- The four triggers that keep effect_counts: one per event, fired once a statement.
DROP TRIGGER IF EXISTS effects_count_on_insert ON effects;
CREATE TRIGGER effects_count_on_insert AFTER INSERT ON effects
REFERENCING NEW TABLE AS inserted_effects
FOR EACH STATEMENT EXECUTE FUNCTION effect_counts_inserted();

-- name: effects_count_on_update
-- Every UPDATE of effects (transition tables allow no column list).
DROP TRIGGER IF EXISTS effects_count_on_update ON effects;
CREATE TRIGGER effects_count_on_update AFTER UPDATE ON effects
REFERENCING OLD TABLE AS replaced_effects NEW TABLE AS updated_effects
FOR EACH STATEMENT EXECUTE FUNCTION effect_counts_updated();

-- name: effects_count_on_delete
-- Every DELETE of effects.
DROP TRIGGER IF EXISTS effects_count_on_delete ON effects;
CREATE TRIGGER effects_count_on_delete AFTER DELETE ON effects
REFERENCING OLD TABLE AS deleted_effects
FOR EACH STATEMENT EXECUTE FUNCTION effect_counts_deleted();

-- name: effects_count_on_truncate
-- TRUNCATE fires no row event: the counts are emptied with the table.
DROP TRIGGER IF EXISTS effects_count_on_truncate ON effects;
CREATE TRIGGER effects_count_on_truncate AFTER TRUNCATE ON effects
FOR EACH STATEMENT EXECUTE FUNCTION effect_counts_truncated();

-- name: attempt_counts_inserted
-- Attempts per minute and outcome, kept as they are logged: the status page's
-- throughput and chart read these, not the attempt log (a day of attempts at
-- 1,000/s is 86M rows). One row per (minute, outcome) a statement logged.
CREATE OR REPLACE FUNCTION attempt_counts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_counts (minute, outcome, n)
    SELECT date_trunc('minute', started_at), outcome, count(*) FROM inserted_attempts
    GROUP BY 1, 2;
    RETURN NULL;
END $$;

-- name: delivery_attempts_count_on_insert
-- Every INSERT into the attempt log (the record, the settling of uncertain sends).
DROP TRIGGER IF EXISTS delivery_attempts_count_on_insert ON delivery_attempts;
CREATE TRIGGER delivery_attempts_count_on_insert AFTER INSERT ON delivery_attempts
REFERENCING NEW TABLE AS inserted_attempts
FOR EACH STATEMENT EXECUTE FUNCTION attempt_counts_inserted();
