"""Resend on request: an operator's resend is sent, and recorded as a resend.

- ``effects.resend_action_id``: the ``operator_actions`` row of the latest resend
  an operator asked for (``outbox effects resend``, spark_outbox.console.resend).
  The claim sends such an effect although the key ledger knows its key delivered:
  the ledger's "never sent again" holds for sends on our own account, and a
  resend is an operator's explicit, audited act.
- ``delivery_attempts.resend_action_id``: the record statement copies it onto every
  attempt of a resend, so the timeline shows which sends an operator asked for.
- ``visible_effects`` gets the column (last, as the views' rule says), and the
  views built on it are re-created from ``objects/due.sql``.

Expand only: two NULLable columns without a default (no rewrite), views that
only gain a column. A dispatcher of the previous release ignores the column: it
settles a resent delivered effect unsent, as "already delivered (key ledger)";
upgrade every dispatcher before resending (docs/operations.md, "Resending").

Revision ID: 2710
Revises: 1804
Create Date: 2026-11-27 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from spark_outbox.core import objects

revision = "2710"
down_revision = "1804"
branch_labels = None
depends_on = None

# The four views as revision 1804 left them (objects/due.sql before this revision).
VIEWS_1804 = (
    """
CREATE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at
FROM effects e
WHERE e.run_id IS NULL
   OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
""",
    """
CREATE VIEW ready_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
  AND (e.run_id IS NULL
       OR e.run_id NOT IN (SELECT b.run_id FROM batches b WHERE b.hold_state = 'held'))
  AND e.send_started_at IS NULL
""",
    """
CREATE VIEW claimable_effects AS
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
""",
    """
CREATE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
""",
)


def upgrade() -> None:
    op.add_column("effects", sa.Column("resend_action_id", sa.BigInteger(), nullable=True))
    op.add_column(
        "delivery_attempts", sa.Column("resend_action_id", sa.BigInteger(), nullable=True)
    )
    op.execute(objects.concern("due"))


def downgrade() -> None:
    # A resend not yet sent stays pending; the old claim then settles it unsent.
    for view in ("due_effects", "claimable_effects", "ready_effects", "visible_effects"):
        op.execute(f"DROP VIEW {view}")
    op.drop_column("delivery_attempts", "resend_action_id")
    op.drop_column("effects", "resend_action_id")
    for view in VIEWS_1804:
        op.execute(view)
