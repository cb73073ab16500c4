"""Send-by times: an optional expiry per effect, and the state ``expired``.

- ``effects.expires_at`` (NULL: no send-by time). Once it has passed the effect
  is never sent: ``ready_effects`` (so the claim, the queue figures and the idle
  check) leaves it out, the dispatcher checks it again right before the first
  byte of a send, and its expiry pass moves it to ``expired`` with the reason.
- state ``expired`` in ``effects`` and ``key_ledger`` (retention writes an
  expired key to the ledger when it purges it, as it does dead ones). The two
  CHECK constraints are replaced ``NOT VALID`` (no scan under the exclusive
  lock, which is held for the catalog change only) and validated afterwards,
  outside the transaction, under a lock that lets writes go on.
- ``deferred_effects.expires_at``: a deferred key taken over keeps its expiry.
- ``ix_effects_expiring``: unfinished effects with a send-by time, by it (the
  expiry pass); ``ix_effects_expired``: expired effects not yet purged, by when
  (retention, /metrics). Both partial and built ``CONCURRENTLY``.

Expand only: the previous release's dispatcher keeps working on it (its claim
reads the new ``due_effects`` and so never takes an expired effect; it writes no
``expires_at``), and so does its sink.

Revision ID: 2720
Revises: 2730
Create Date: 2026-11-27 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context, op

revision = "2720"
down_revision = "2730"
branch_labels = None
depends_on = None

STATES = "'pending', 'leased', 'delivered', 'dead', 'cancelled', 'uncertain'"
LEDGER_STATES = "'delivered', 'dead', 'cancelled'"
EXPIRING = "expires_at IS NOT NULL AND state IN ('pending', 'leased')"
EXPIRED = "state = 'expired' AND purged_at IS NULL"

# due.sql as revision 2710 left it (visible_effects without expires_at, ready_effects
# without the send-by filter, and the two views built on them): what a downgrade
# puts back.
VISIBLE_EFFECTS_2710 = """
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id
FROM effects e
WHERE e.run_id IS NULL
   OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
"""

READY_EFFECTS_2710 = """
CREATE OR REPLACE VIEW ready_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
  AND (e.run_id IS NULL
       OR e.run_id NOT IN (SELECT b.run_id FROM batches b WHERE b.hold_state = 'held'))
  AND e.send_started_at IS NULL
"""

CLAIMABLE_EFFECTS_2710 = """
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

DUE_EFFECTS_2710 = """
CREATE OR REPLACE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
"""


def _states(table: str, states: str, *, later: bool = True) -> None:
    """Replace a table's state check; ``later``: NOT VALID, validated by the caller."""
    # Dropped IF EXISTS, then added: a second run (after the part below failed) finds
    # the new check there and replaces it again; one transaction, so never without one.
    op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS ck_{table}_state")
    op.execute(
        f"ALTER TABLE {table} ADD CONSTRAINT ck_{table}_state CHECK (state IN ({states}))"
        + (" NOT VALID" if later else "")
    )


# objects/due.sql as this revision ran it, through the release that followed (the file
# is head's text: revision 2810 made its unpark trigger a statement trigger).
DUE_2720 = """
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
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id, e.expires_at
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
-- claim does not walk past every waiting effect. When an effect stops blocking,
-- whichever code path finishes or deletes it, this wakes its successor (the next
-- unfinished effect of the endpoint and key, in (created_at, id) order): only if
-- parked, and not if its batch is held (a release makes held effects due). It
-- notifies the dispatchers whenever there was a successor, parked or not.
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

-- name: effects_unpark_on_finish
-- An effect with an ordering key stops blocking its successor when it leaves
-- 'pending'/'leased' (delivered, dead, cancelled, uncertain, expired): an expired
-- head of a key unblocks its successors when the expiry pass moves it.
-- Dropped and created, not CREATE OR REPLACE TRIGGER: that needs PostgreSQL 14,
-- and the outbox runs on 13 (docs/operations.md).
DROP TRIGGER IF EXISTS effects_unpark_on_finish ON effects;
CREATE TRIGGER effects_unpark_on_finish AFTER UPDATE OF state ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased')
      AND NEW.state NOT IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();

-- name: effects_unpark_on_delete
-- ... or when it is deleted unfinished, whichever code path deletes it (the
-- sweeper deletes the written rows of a run that can never commit).
DROP TRIGGER IF EXISTS effects_unpark_on_delete ON effects;
CREATE TRIGGER effects_unpark_on_delete AFTER DELETE ON effects
FOR EACH ROW
WHEN (OLD.ordering_key IS NOT NULL AND OLD.state IN ('pending', 'leased'))
EXECUTE FUNCTION effect_unpark_successor();
"""


def upgrade() -> None:
    # The catalog changes below need effects' exclusive lock for an instant; behind a
    # long transaction they would queue every dispatcher behind them: give up instead.
    op.execute("SET LOCAL lock_timeout = '10s'")
    for table in ("effects", "deferred_effects"):
        column = sa.Column("expires_at", sa.DateTime(timezone=True))
        op.add_column(table, column, if_not_exists=True)
    _states("effects", f"{STATES}, 'expired'")
    _states("key_ledger", f"{LEDGER_STATES}, 'expired'")
    op.execute(DUE_2720)
    # What comes before is committed here; a failure below leaves the revision at
    # 1804 and the upgrade can simply run again (every step above repeats safely).
    with op.get_context().autocommit_block():
        op.execute("ALTER TABLE effects VALIDATE CONSTRAINT ck_effects_state")
        op.execute("ALTER TABLE key_ledger VALIDATE CONSTRAINT ck_key_ledger_state")
        _index_concurrently("ix_effects_expiring", ["expires_at"], EXPIRING)
        _index_concurrently("ix_effects_expired", ["updated_at", "id"], EXPIRED)


def _index_concurrently(name: str, columns: list[str], where: str) -> None:
    """Built without blocking writes; an invalid one a failed build left is dropped first."""
    if not context.is_offline_mode():
        invalid = op.get_bind().execute(
            sa.text(
                "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " WHERE c.relname = :name"
            ),
            {"name": name},
        )
        if invalid.scalar():
            op.execute(f"DROP INDEX CONCURRENTLY {name}")
    op.create_index(
        name,
        "effects",
        columns,
        postgresql_where=sa.text(where),
        postgresql_concurrently=True,
        if_not_exists=True,
    )


def downgrade() -> None:
    # Expired effects become cancelled (never sent, finished), the closest state
    # the old schema has; their send-by times are dropped with the column.
    op.execute(
        "UPDATE effects SET state = 'cancelled', "
        "last_error = 'expired (downgraded): ' || COALESCE(last_error, '') "
        "WHERE state = 'expired'"
    )
    op.execute("UPDATE key_ledger SET state = 'cancelled' WHERE state = 'expired'")
    op.drop_index("ix_effects_expired", table_name="effects", postgresql_where=sa.text(EXPIRED))
    op.drop_index("ix_effects_expiring", table_name="effects", postgresql_where=sa.text(EXPIRING))
    _states("effects", STATES, later=False)
    _states("key_ledger", LEDGER_STATES, later=False)
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.execute("DROP VIEW ready_effects")
    op.execute("DROP VIEW visible_effects")
    op.drop_column("effects", "expires_at")
    op.drop_column("deferred_effects", "expires_at")
    op.execute(VISIBLE_EFFECTS_2710)
    op.execute(READY_EFFECTS_2710)
    op.execute(CLAIMABLE_EFFECTS_2710)
    op.execute(DUE_EFFECTS_2710)
