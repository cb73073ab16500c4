"""Safety valves (issue 13): held batches, per-endpoint counts, corrections.

- ``batches.hold_state`` (NULL: never held; ``held``, ``released``, ``cancelled``)
  and ``hold_reason``: the volume guard holds an outsized batch at its commit;
  its effects are visible (audit, support page) but not claimable until an
  operator releases it; /v1/status and /metrics find recent batches with payload
  mismatches through a partial index. ``hold_resolved_at``: when it was released or cancelled.
  A partial index on the held markers' ``run_id`` keeps the claim's exclusion a
  probe of a tiny index (held batches are few).
- ``batches.effects_new_by_endpoint``: the batch's new effects per endpoint
  (``{"endpoint": n}``), the guard's baseline input; NULL on older markers.
- ``effects.supersedes``: the key of the effect this one corrects (a revision,
  ``effect_key(..., revision=n)``); the audit shows the chain both ways.
  ``deferred_effects.supersedes`` carries it through a deferred key.
- ``claimable_effects`` (and so ``due_effects``) excludes the effects of held
  batches; ``visible_effects`` is re-created to carry ``supersedes``.

Revision ID: 1321
Revises: 1201
Create Date: 2026-11-23 11:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "1321"
down_revision = "1201"
branch_labels = None
depends_on = None

VISIBLE_EFFECTS = """
CREATE VIEW visible_effects AS
SELECT e.*
FROM effects e
WHERE e.run_id IS NULL
   OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
"""

CLAIMABLE_EFFECTS = """
CREATE VIEW claimable_effects AS
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
"""

OLD_CLAIMABLE_EFFECTS = """
CREATE VIEW claimable_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  -- NOT IN (a hashed filter) rather than a join: a scan in index order stays in
  -- order and stops at LIMIT.
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
"""

DUE_EFFECTS = """
CREATE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
"""


def _drop_views() -> None:
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.execute("DROP VIEW visible_effects")


def upgrade() -> None:
    _drop_views()
    op.add_column("effects", sa.Column("supersedes", sa.Text(), nullable=True))
    op.create_index(
        op.f("ix_effects_supersedes"),
        "effects",
        ["supersedes"],
        unique=False,
        postgresql_where=sa.text("supersedes IS NOT NULL"),
    )
    op.add_column("deferred_effects", sa.Column("supersedes", sa.Text(), nullable=True))
    op.add_column(
        "batches",
        sa.Column(
            "effects_new_by_endpoint", postgresql.JSONB(astext_type=sa.Text()), nullable=True
        ),
    )
    op.add_column("batches", sa.Column("hold_state", sa.Text(), nullable=True))
    op.add_column("batches", sa.Column("hold_reason", sa.Text(), nullable=True))
    op.add_column(
        "batches", sa.Column("hold_resolved_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.create_check_constraint(
        op.f("ck_batches_hold_state"),
        "batches",
        "hold_state IN ('held', 'released', 'cancelled')",
    )
    op.create_index(
        op.f("ix_batches_run_id_held"),
        "batches",
        ["run_id"],
        unique=False,
        postgresql_where=sa.text("hold_state = 'held'"),
    )
    op.create_index(
        op.f("ix_batches_committed_at_mismatched"),
        "batches",
        ["committed_at"],
        unique=False,
        postgresql_where=sa.text("payload_mismatches > 0"),
    )
    op.execute(VISIBLE_EFFECTS)
    op.execute(CLAIMABLE_EFFECTS)
    op.execute(DUE_EFFECTS)


def downgrade() -> None:
    _drop_views()
    op.drop_index(
        op.f("ix_batches_committed_at_mismatched"),
        table_name="batches",
        postgresql_where=sa.text("payload_mismatches > 0"),
    )
    op.drop_index(
        op.f("ix_batches_run_id_held"),
        table_name="batches",
        postgresql_where=sa.text("hold_state = 'held'"),
    )
    op.drop_constraint(op.f("ck_batches_hold_state"), "batches", type_="check")
    op.drop_column("batches", "hold_resolved_at")
    op.drop_column("batches", "hold_reason")
    op.drop_column("batches", "hold_state")
    op.drop_column("batches", "effects_new_by_endpoint")
    op.drop_index(
        op.f("ix_effects_supersedes"),
        table_name="effects",
        postgresql_where=sa.text("supersedes IS NOT NULL"),
    )
    op.drop_column("effects", "supersedes")
    op.drop_column("deferred_effects", "supersedes")
    op.execute(VISIBLE_EFFECTS)
    op.execute(OLD_CLAIMABLE_EFFECTS)
    op.execute(DUE_EFFECTS)
