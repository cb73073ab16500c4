"""The due views carry each row's address: the claim locks an ordered front by it.

An ordered endpoint's claim reads a window of its due rows from ``effects``, keeps
each key's earliest, then locks each of those through ``due_effects`` (the view
checks it is still claimable). Locked by id, the planner could reach the row
through ``ix_effects_due`` instead of the primary key: statistics taken while
nothing was due price that index's range (every due row) below a primary-key
probe, and a claim behind 28,000 waiting effects took 8.2 s (500 probes, each
reading every due row). ``visible_effects`` now ends with ``row_ctid`` (the row
version's ``ctid``), the views built on it with it (``SELECT e.*`` is expanded
when a view is made, so they are made again), and the claim finds each row by
the address the window read, a TID scan no statistics price above an index.

Online and expand-only: ``CREATE OR REPLACE`` adds the column at the end; the
previous release reads these views by column name and needs nothing.

Revision ID: 2811
Revises: 2810
Create Date: 2026-11-28 01:30:00
"""

from __future__ import annotations

from alembic import op

from spark_outbox.core import objects

revision = "2811"
down_revision = "2810"
branch_labels = None
depends_on = None

_VIEWS = ("visible_effects", "ready_effects", "claimable_effects", "due_effects")

# The four views as revision 2810 left them (objects/due.sql then): what a
# downgrade puts back. A column cannot leave a view in place: they are dropped,
# the one built on the others first, and made again.
_VIEWS_2810 = """
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id, e.expires_at
FROM effects e
WHERE e.run_id IS NULL
   OR (SELECT true FROM batches b WHERE b.run_id = e.run_id LIMIT 1);

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

CREATE OR REPLACE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now();
"""


def upgrade() -> None:
    for name in _VIEWS:
        op.execute(objects.text(name))


def downgrade() -> None:
    for name in reversed(_VIEWS):
        op.execute(f"DROP VIEW {name}")
    op.execute(_VIEWS_2810)
