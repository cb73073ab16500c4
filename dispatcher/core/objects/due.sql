-- "Due": which effects a dispatcher may send now (docs/design.md, glossary:
-- visible, claimable, due, parked). Four views, each built on the one before:
-- visible_effects -> ready_effects -> claimable_effects -> due_effects, and the
-- trigger that wakes a parked successor. Apply the whole file to change one link:
-- a view's columns are fixed when it is created, so the views above a changed one
-- are re-created after it, in this order.

-- name: visible_effects
-- An effect exists for everyone (dispatcher, API, support page, reports) once it
-- was enqueued outside Spark (run_id NULL) or its run committed (a marker in
-- batches holds the run_id): the one definition of "visible"; every read of
-- effects goes through it. The columns are listed, not e.*: e.* is expanded once,
-- when the view is made, and CREATE OR REPLACE may only add columns at the end, so
-- the list is the order the migrations added them in; a new column goes last.
-- The marker is probed per row (uq_batches_run_id), in a form the planner cannot
-- turn into a hash of every marker: as EXISTS it hashed all of batches for each
-- read, a claim of 500 effects or a status page alike, a cost that grows with the
-- history of markers, not with the rows read (migration 2771).
-- row_ctid, last, is the row version's address (ctid): the claim locks an ordered
-- endpoint's front rows by it, a path no statistics can price above another
-- (store.sql, claim; migration 2811).
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id, e.expires_at, e.ctid AS row_ctid
FROM effects e
WHERE e.run_id IS NULL
   OR (SELECT true FROM batches b WHERE b.run_id = e.run_id LIMIT 1);

-- name: ready_effects
-- Claimable but for per-key ordering: visible, unfinished, its endpoint not
-- paused, its batch not held, no send started (a started send's outcome is
-- unknown until recorded; its expired lease becomes 'uncertain', never a resend),
-- its send-by time (expires_at) not passed: an effect past it is never claimed,
-- whether or not the dispatcher's expiry pass has moved it to 'expired' yet.
-- The queue depth counts these (dispatcher/health.sql), so no count walks the
-- ordering probe.
CREATE OR REPLACE VIEW ready_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  -- NOT IN (a hashed filter) rather than a join: a scan in index order stays in
  -- order and stops at LIMIT.
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
  -- Held batches (the volume guard) wait for an operator; the same hashed filter,
  -- read from the partial index of held markers.
  AND (e.run_id IS NULL
       OR e.run_id NOT IN (SELECT b.run_id FROM batches b WHERE b.hold_state = 'held'))
  AND e.send_started_at IS NULL
  AND (e.expires_at IS NULL OR e.expires_at > now());

-- name: claimable_effects
-- Ready, and on an ordered endpoint not behind an earlier unfinished effect of its
-- ordering key. The probe is one step back in ix_effects_ordering from the
-- effect's own entry (ORDER BY ... DESC LIMIT 1), a form that index serves without
-- a sort; NOT EXISTS let the planner probe through ix_effects_due instead, every
-- unfinished effect of the endpoint per probe (migration 1104).
CREATE OR REPLACE VIEW claimable_effects AS
SELECT e.*
FROM ready_effects e
WHERE e.ordering_key IS NULL
   OR e.endpoint NOT IN (SELECT o.name FROM endpoints o WHERE o.ordered)
   OR (SELECT 1 FROM effects p
       WHERE p.endpoint = e.endpoint AND p.ordering_key = e.ordering_key
         AND p.state IN ('pending', 'leased')
         AND (p.created_at, p.id) < (e.created_at, e.id)
       ORDER BY p.created_at DESC, p.id DESC
       LIMIT 1) IS NULL;

-- name: due_effects
-- Claimable and due now: what the claim, the idle check and the queue metrics
-- read. A plain view, inlined by the planner: the claim still walks
-- ix_effects_due in order and stops at its LIMIT (tests/dispatcher/test_store.py).
CREATE OR REPLACE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now();

-- name: effect_unpark_successor
-- An ordered endpoint's effect waiting behind an earlier one of its key is parked
-- (next_attempt_at = 'infinity'), out of the claim's range of ix_effects_due, so a
-- claim does not walk past every waiting effect. When effects stop blocking,
-- whichever code path finishes or deletes them, this wakes, for each key, the
-- successor of the earliest of them (the next unfinished effect of the endpoint and
-- key, in (created_at, id) order): only if parked, and not if its batch is held (a
-- release makes held effects due). A later successor of the same key waits behind
-- that one anyway (parking never strands the earliest unfinished effect of a key).
-- It notifies the dispatchers once whenever there was a successor, parked or not.
-- Once a statement, not once a row (migration 2810): as a row trigger, each
-- finished effect ran its own probe, its own UPDATE of effects (firing that
-- UPDATE's statement triggers) and its own notify, ~30-50 us a finished ordered
-- effect, the largest part of a record of an ordered endpoint's outcomes.
-- A statement trigger cannot name columns (it fires for every UPDATE of effects,
-- claims included): most change no state to a finished one, and leave after one
-- pass over their new rows.
CREATE OR REPLACE FUNCTION effect_unpark_successor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- the finished effects, one array a column (an array of whole rows of the
    -- transition table is of type record[]: assigned to effects[], each row was
    -- cast through its text, ~30 us a row)
    endpoints text[];
    keys text[];
    created timestamptz[];
    ids bigint[];
    successors bigint;
    parked bigint[];
    woken bigint[];
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF NOT EXISTS (SELECT 1 FROM effects_after n
                       WHERE n.ordering_key IS NOT NULL
                         AND n.state NOT IN ('pending', 'leased')) THEN
            RETURN NULL;
        END IF;
        SELECT array_agg(o.endpoint), array_agg(o.ordering_key), array_agg(o.created_at),
               array_agg(o.id)
        INTO endpoints, keys, created, ids
        FROM effects_before o JOIN effects_after n ON n.id = o.id
        WHERE o.ordering_key IS NOT NULL AND o.state IN ('pending', 'leased')
          AND n.state NOT IN ('pending', 'leased');
    ELSE
        SELECT array_agg(o.endpoint), array_agg(o.ordering_key), array_agg(o.created_at),
               array_agg(o.id)
        INTO endpoints, keys, created, ids
        FROM effects_before o
        WHERE o.ordering_key IS NOT NULL AND o.state IN ('pending', 'leased');
    END IF;
    IF ids IS NULL THEN
        RETURN NULL;
    END IF;
    WITH firsts AS (
        SELECT DISTINCT ON (f.endpoint, f.ordering_key)
               f.endpoint, f.ordering_key, f.created_at, f.id
        FROM unnest(endpoints, keys, created, ids) AS f(endpoint, ordering_key, created_at, id)
        ORDER BY f.endpoint, f.ordering_key, f.created_at, f.id
    ), found AS (
        -- one step forward in ix_effects_ordering from the finished effect's entry;
        -- whether it is parked is read on the way, so a successor that is not
        -- (the usual one: the effect right behind a head stays due) costs no lookup
        SELECT s.id, s.parked FROM firsts f
        CROSS JOIN LATERAL (
            SELECT n.id, n.state = 'pending' AND n.next_attempt_at = 'infinity' AS parked
            FROM effects n
            WHERE n.endpoint = f.endpoint AND n.ordering_key = f.ordering_key
              AND n.state IN ('pending', 'leased')
              AND (n.created_at, n.id) > (f.created_at, f.id)
            ORDER BY n.created_at, n.id
            LIMIT 1) s
    )
    SELECT count(*), array_agg(found.id) FILTER (WHERE found.parked)
    INTO successors, parked
    FROM found;
    IF parked IS NOT NULL THEN
        -- Each locked by its id alone, then checked (still parked, its batch not
        -- held): a condition on state or next_attempt_at beside the join let the
        -- planner, on statistics that saw few parked rows, walk every parked effect
        -- in ix_effects_due against each successor (up to 28,000 x 300 a record,
        -- ~130 ms, in bench dispatch's ordered rounds).
        SELECT array_agg(p.id) INTO woken
        FROM unnest(parked) AS w(id)
        CROSS JOIN LATERAL (
            SELECT e.id, e.state, e.next_attempt_at, e.run_id FROM effects e
            WHERE e.id = w.id
            OFFSET 0
            FOR UPDATE OF e) p
        WHERE p.state = 'pending' AND p.next_attempt_at = 'infinity'
          AND NOT EXISTS (SELECT 1 FROM batches b
                          WHERE b.run_id = p.run_id AND b.hold_state = 'held');
        IF woken IS NOT NULL THEN
            UPDATE effects SET next_attempt_at = now() WHERE id = ANY(woken);
        END IF;
    END IF;
    -- Parked or not, a successor may be due now: the dispatchers claim it at
    -- COMMIT, not at their next poll (dispatcher.wakeup.CHANNEL).
    IF successors > 0 THEN
        PERFORM pg_notify('outbox_effects', 'ordered');
    END IF;
    RETURN NULL;
END $$;

-- name: effects_unpark_on_finish
-- An effect with an ordering key stops blocking its successor when it leaves
-- 'pending'/'leased' (delivered, dead, cancelled, uncertain, expired): an expired
-- head of a key unblocks its successors when the expiry pass moves it.
-- Once a statement, with its old and new rows (PostgreSQL keeps one copy of them
-- for every trigger of the event: effects_count_on_update reads the same).
-- Dropped and created, not CREATE OR REPLACE TRIGGER: that needs PostgreSQL 14,
-- and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS effects_unpark_on_finish ON effects;
CREATE TRIGGER effects_unpark_on_finish AFTER UPDATE ON effects
REFERENCING OLD TABLE AS effects_before NEW TABLE AS effects_after
FOR EACH STATEMENT EXECUTE FUNCTION effect_unpark_successor();

-- name: effects_unpark_on_delete
-- ... or when it is deleted unfinished, whichever code path deletes it (the
-- sweeper deletes the written rows of a run that can never commit).
DROP TRIGGER IF EXISTS effects_unpark_on_delete ON effects;
CREATE TRIGGER effects_unpark_on_delete AFTER DELETE ON effects
REFERENCING OLD TABLE AS effects_before
FOR EACH STATEMENT EXECUTE FUNCTION effect_unpark_successor();
