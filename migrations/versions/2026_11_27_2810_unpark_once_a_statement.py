"""The trigger that wakes an ordered key's parked successor runs once a statement.

As a row trigger, each effect an UPDATE or DELETE finished ran its own probe for
its successor, its own UPDATE of effects (which fired that UPDATE's statement
triggers) and its own notify: ~30-50 us a finished ordered effect, the largest
part of a record of an ordered endpoint's outcomes. Now one statement trigger
per event reads the finished rows from its transition tables, probes one
successor per key, wakes the parked ones in one UPDATE and notifies once
(objects/due.sql).

Online and expand-only: the function and both triggers keep their names (the
previous release's parking pass looks the finish trigger up by name, and parks
only where it exists); the triggers are replaced in one transaction, so no
statement runs between the old trigger and the new one.

Revision ID: 2810
Revises: 2773
Create Date: 2026-11-27 22:30:00
"""

from __future__ import annotations

from alembic import op

from spark_outbox.core import objects

revision = "2810"
down_revision = "2773"
branch_labels = None
depends_on = None

_OBJECTS = ("effect_unpark_successor", "effects_unpark_on_finish", "effects_unpark_on_delete")

# The row trigger and its function as migration 2710 left them.
_ROW_TRIGGERS = """
CREATE OR REPLACE FUNCTION effect_unpark_successor() RETURNS trigger LANGUAGE plpgsql AS $$
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

DROP TRIGGER IF EXISTS effects_unpark_on_finish ON effects;
CREATE TRIGGER effects_unpark_on_finish AFTER UPDATE OF state ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased')
      AND NEW.state NOT IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();

DROP TRIGGER IF EXISTS effects_unpark_on_delete ON effects;
CREATE TRIGGER effects_unpark_on_delete AFTER DELETE ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();
"""


def upgrade() -> None:
    for name in _OBJECTS:
        op.execute(objects.text(name))


def downgrade() -> None:
    op.execute(_ROW_TRIGGERS)
