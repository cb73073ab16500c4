"""Uncertain instead of blind resend (docs/dispatcher.md, "Uncertain sends").

- ``endpoints.deduplicates``: does the receiver honour the idempotency key? NOT
  NULL; when an insert leaves it out, a trigger sets the kind's default (webhook:
  true, e-mail: false), so no writer can give an e-mail endpoint the webhook's.
- ``effects.send_started_at``: written (durably) before the first byte of a send
  to a non-deduplicating endpoint, cleared when its outcome is recorded.
- state ``uncertain``: the send started and its outcome is unknown (the
  dispatcher died mid-send, or the connection broke after the message was handed
  over). Never claimed, never retried; an operator marks it delivered or sends it
  again.
- ``ix_effects_send_started``: leased rows whose send started, by lease expiry:
  what ``settle_uncertain`` reads (rows are in it only while a send is in flight).
- ``visible_effects``, ``claimable_effects``, ``due_effects`` are re-created in
  place with the new column (they select ``e.*``); ``claimable_effects`` keeps
  everything revision 1411 gave it (held batches excluded, the ordering rule)
  and leaves out rows whose send started: an expired lease of a started send is
  never claimed, whether or not ``settle_uncertain`` has run yet.

Revision ID: 1311
Revises: 1411
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1311"
down_revision = "1411"
branch_labels = None
depends_on = None

STATES = "('pending', 'leased', 'delivered', 'dead', 'cancelled')"
NEW_STATES = "('pending', 'leased', 'delivered', 'dead', 'cancelled', 'uncertain')"
STARTED = "state = 'leased' AND send_started_at IS NOT NULL"

VISIBLE_EFFECTS = """
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.*
FROM effects e
WHERE e.run_id IS NULL
   OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
"""

# claimable_effects as revision 1411 left it.
CLAIMABLE_EFFECTS_1411 = """
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
"""

# A send that started is never claimed again: its outcome is unknown until it is
# recorded, and an expired lease of it becomes 'uncertain' (settle_uncertain).
CLAIMABLE_EFFECTS = (
    CLAIMABLE_EFFECTS_1411.rstrip()
    + """
  AND e.send_started_at IS NULL
"""
)

DUE_EFFECTS = """
CREATE OR REPLACE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
"""

DEDUPLICATES_DEFAULT = """
CREATE FUNCTION endpoint_deduplicates_default() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.deduplicates IS NULL THEN
        NEW.deduplicates := NEW.kind = 'webhook';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER endpoints_deduplicates_default BEFORE INSERT ON endpoints
FOR EACH ROW EXECUTE FUNCTION endpoint_deduplicates_default();
"""


def _views(claimable: str) -> None:
    op.execute(VISIBLE_EFFECTS)
    op.execute(claimable)
    op.execute(DUE_EFFECTS)


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("deduplicates", sa.Boolean(), nullable=True))
    op.execute("UPDATE endpoints SET deduplicates = (kind = 'webhook')")
    op.alter_column("endpoints", "deduplicates", nullable=False)
    op.execute(DEDUPLICATES_DEFAULT)
    op.add_column(
        "effects", sa.Column("send_started_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.drop_constraint(op.f("ck_effects_state"), "effects", type_="check")
    op.create_check_constraint(op.f("ck_effects_state"), "effects", f"state IN {NEW_STATES}")
    op.create_index(
        "ix_effects_send_started",
        "effects",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa.text(STARTED),
    )
    _views(CLAIMABLE_EFFECTS)


def downgrade() -> None:
    # Uncertain effects go back to pending (sent again): the old schema has no
    # other way to say "unknown".
    op.execute(
        "UPDATE effects SET state = 'pending', next_attempt_at = now() WHERE state = 'uncertain'"
    )
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.execute("DROP VIEW visible_effects")
    op.drop_index(
        "ix_effects_send_started", table_name="effects", postgresql_where=sa.text(STARTED)
    )
    op.drop_constraint(op.f("ck_effects_state"), "effects", type_="check")
    op.create_check_constraint(op.f("ck_effects_state"), "effects", f"state IN {STATES}")
    op.drop_column("effects", "send_started_at")
    op.execute("DROP TRIGGER endpoints_deduplicates_default ON endpoints")
    op.execute("DROP FUNCTION endpoint_deduplicates_default()")
    op.drop_column("endpoints", "deduplicates")
    _views(CLAIMABLE_EFFECTS_1411)
