"""Ordered endpoints: an effect waiting behind an earlier one of its key is parked.

An ordered endpoint's effect with an earlier unfinished effect of the same
ordering key is not due (``claimable_effects``). It still sat in the claim's
range of ``ix_effects_due``, so every claim walked past every such effect, one
ordering probe each: with 30,000 effects over 1,000 keys, a claim took ~30 ms
and walked ~29,000 rows; the cost of a claim grew with the backlog.

Now the dispatcher parks them (``next_attempt_at = 'infinity'``, as a held
batch's effects are parked: out of the claim's index range, shown as no next
attempt), and this trigger wakes an effect's successor the moment the effect
stops blocking it: on every change out of 'pending'/'leased' and on a delete,
whichever code path makes it, and wakes the dispatchers whenever the effect had
a successor, parked or not (a successor was claimed only at their next poll, up
to 1 s later, before). The view stays the one definition of "due";
parking only keeps the claim from walking what the view would refuse.

The view's ordering probe becomes "the nearest earlier unfinished effect of the
key" (ORDER BY ... DESC LIMIT 1) instead of NOT EXISTS: the same answer, but a
form only ix_effects_ordering serves without a sort, and the dispatcher's
sessions forbid sorts. With NOT EXISTS, statistics taken while the queue was
empty let the planner probe through ix_effects_due instead, every unfinished
effect of the endpoint per probe: a claim behind 29,000 waiting effects took
8.2 s (EXPLAIN ANALYZE), 1.1-1.6 s in a bench drain (auto_explain).

claimable_effects is split in two: ``ready_effects`` (everything but per-key
ordering), and claimable_effects on it with the ordering probe. The queue depth
counts ready effects due now, without the probe.

Revision ID: 1104
Revises: 1421
Create Date: 2026-11-24 01:00:00
"""

from __future__ import annotations

from alembic import op

revision = "1104"
down_revision = "1421"
branch_labels = None
depends_on = None

# The successor is the next unfinished effect of the same endpoint and key, in
# (created_at, id) order (ix_effects_ordering): woken only if parked, and not if
# its batch is held (a release makes held effects due; docs/operations.md).
UNPARK = """
CREATE FUNCTION effect_unpark_successor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    successor bigint;
BEGIN
    SELECT n.id INTO successor FROM effects n
    WHERE n.endpoint = OLD.endpoint AND n.ordering_key = OLD.ordering_key
      AND n.state IN ('pending', 'leased')
      AND (n.created_at, n.id) > (OLD.created_at, OLD.id)
    ORDER BY n.created_at, n.id
    LIMIT 1;
    IF successor IS NULL THEN
        RETURN NULL;
    END IF;
    UPDATE effects s SET next_attempt_at = now()
    WHERE s.id = successor AND s.state = 'pending' AND s.next_attempt_at = 'infinity'
      AND NOT EXISTS (SELECT 1 FROM batches b
                      WHERE b.run_id = s.run_id AND b.hold_state = 'held');
    -- Parked or not, the successor may be due now: the dispatchers claim it at
    -- COMMIT, not at their next poll (dispatcher.wakeup.CHANNEL; one notification
    -- per transaction and text).
    PERFORM pg_notify('outbox_effects', 'ordered');
    RETURN NULL;
END $$;
CREATE TRIGGER effects_unpark_on_finish AFTER UPDATE OF state ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased')
      AND NEW.state NOT IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();
CREATE TRIGGER effects_unpark_on_delete AFTER DELETE ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();
"""


# claimable_effects as revision 1311 left it.
CLAIMABLE_EFFECTS_1311 = """
CREATE OR REPLACE VIEW claimable_effects AS
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
  AND (e.ordering_key IS NULL
       OR e.endpoint NOT IN (SELECT o.name FROM endpoints o WHERE o.ordered)
       OR NOT EXISTS (
            SELECT 1 FROM effects p
            WHERE p.endpoint = e.endpoint AND p.ordering_key = e.ordering_key
              AND p.state IN ('pending', 'leased')
              AND (p.created_at, p.id) < (e.created_at, e.id)))
  AND e.send_started_at IS NULL
"""

# What claimable_effects is without per-key ordering: visible, unfinished, its
# endpoint not paused, its batch not held, no send started. The queue depth reads
# it (dispatcher/health.sql): an effect waiting behind its key counts there until
# it is parked, and no count walks the ordering probe.
READY_EFFECTS = """
CREATE VIEW ready_effects AS
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
"""

# The ordering probe as one step back in ix_effects_ordering from the effect's own
# entry (the nearest earlier unfinished effect of its key).
CLAIMABLE_EFFECTS = """
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
       LIMIT 1) IS NULL
"""


def upgrade() -> None:
    op.execute(UNPARK)
    op.execute(READY_EFFECTS)
    op.execute(CLAIMABLE_EFFECTS)


def downgrade() -> None:
    op.execute(CLAIMABLE_EFFECTS_1311)
    op.execute("DROP VIEW ready_effects")
    op.execute("DROP TRIGGER effects_unpark_on_delete ON effects")
    op.execute("DROP TRIGGER effects_unpark_on_finish ON effects")
    op.execute("DROP FUNCTION effect_unpark_successor()")
    # Parked effects due again: the old schema's claim walks them (and skips them).
    op.execute(
        "UPDATE effects SET next_attempt_at = now()"
        " WHERE state = 'pending' AND next_attempt_at = 'infinity' AND ordering_key IS NOT NULL"
        " AND NOT EXISTS (SELECT 1 FROM batches b"
        " WHERE b.run_id = effects.run_id AND b.hold_state = 'held')"
    )
