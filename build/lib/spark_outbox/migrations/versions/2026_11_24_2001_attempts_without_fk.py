"""The attempt log's foreign key to effects goes: its check was on the hot path.

Every recorded attempt ran the key's check, a locking look-up of its effect
(``SELECT ... FOR KEY SHARE``): EXPLAIN ANALYZE of a 250-row record, 1.9-2.4 ms of
a 15 ms statement, ~8 us of PostgreSQL a delivery. What it guarded holds anyway:

- an attempt is written only for an effect that exists: the record inserts
  attempts ``WHERE EXISTS`` their effect, in the statement that updates it, and
  settle_uncertain for the rows it has just locked;
- an effect with attempts is never deleted: the sweeper deletes only effects of
  runs that never committed (never visible, so never claimed), and its delete now
  also says "and no attempt of it"; retention deletes attempts itself, first.

The ON DELETE CASCADE never fired on those paths.

Revision ID: 2001
Revises: 1104
Create Date: 2026-11-24 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "2001"
down_revision = "1104"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint(
        "fk_delivery_attempts_effect_id_effects", "delivery_attempts", type_="foreignkey"
    )


def downgrade() -> None:
    # Attempts of effects deleted meanwhile (none, by the rules above) go first.
    op.execute(
        "DELETE FROM delivery_attempts a"
        " WHERE NOT EXISTS (SELECT 1 FROM effects e WHERE e.id = a.effect_id)"
    )
    op.create_foreign_key(
        "fk_delivery_attempts_effect_id_effects",
        "delivery_attempts",
        "effects",
        ["effect_id"],
        ["id"],
        ondelete="CASCADE",
    )
