"""Visibility, not placement, is atomic: executors write effects straight into ``effects``.

- ``effects.run_id``: the sink's run that wrote the row (NULL for ``enqueue``).
  A row is *visible* iff ``run_id IS NULL`` or its run committed (a marker in
  ``batches`` holds that run_id; ``uq_batches_run_id``). The view
  ``visible_effects`` is that rule, defined once; ``claimable_effects`` (and so
  ``due_effects``) is built on it, and every read of effects goes through it.
  Rows written before this revision have ``run_id`` NULL: they were committed.
- ``deferred_effects``: an effect a run met already written by another run that
  had no marker, kept whole until the run's commit decides (take it over, or
  count it deduplicated). Logged: losing one would lose an effect.
- ``staged_rejects`` replaces ``staged_effects`` (valid effect rows no longer go
  through staging); ``staged_chunks`` goes (no chunk merger); ``staged_results``
  loses its chunk tag. Staging rows are transient, so these tables are recreated.
- ``batch_runs.swept_at``: set by the sweeper before it deletes a dead run's
  rows; a run whose row is swept can no longer commit.

Revision ID: 1201
Revises: 1101
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "1201"
down_revision = "1101"
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
"""

# As migration 0003 made it: its ``e.*`` meant the columns of that time (no
# ``reference``, which 0004's downgrade drops), so they are listed.
OLD_CLAIMABLE_EFFECTS = """
CREATE VIEW claimable_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error
FROM effects e
WHERE e.state IN ('pending', 'leased')
  AND (e.job IS NULL OR EXISTS (
        SELECT 1 FROM batches b WHERE b.job = e.job AND b.batch_id = e.batch_id))
  -- NOT IN (a hashed filter) rather than a join: a scan in index order stays in
  -- order and stops at LIMIT.
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
"""

DUE_EFFECTS = """
CREATE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
"""


def _uuid(name: str) -> sa.Column[object]:
    return sa.Column(name, postgresql.UUID(as_uuid=True), nullable=False)


def upgrade() -> None:
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.add_column("effects", sa.Column("run_id", postgresql.UUID(as_uuid=True), nullable=True))
    op.create_unique_constraint(op.f("uq_batches_run_id"), "batches", ["run_id"])
    op.add_column("batch_runs", sa.Column("swept_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "deferred_effects",
        _uuid("run_id"),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column("ordering_key", sa.Text(), nullable=True),
        sa.Column("reference", sa.Text(), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(op.f("ix_deferred_effects_run_id"), "deferred_effects", ["run_id"])
    op.drop_table("staged_chunks")
    op.drop_table("staged_effects")
    op.drop_table("staged_results")
    op.create_table(
        "staged_results",
        _uuid("run_id"),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("row", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        prefixes=["UNLOGGED"],
    )
    op.create_table(
        "staged_rejects",
        _uuid("run_id"),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw_row", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        prefixes=["UNLOGGED"],
    )
    for table in ("staged_results", "staged_rejects"):
        op.create_index(op.f(f"ix_{table}_run_id_task_id"), table, ["run_id", "task_id"])
    op.execute(VISIBLE_EFFECTS)
    op.execute(CLAIMABLE_EFFECTS)
    op.execute(DUE_EFFECTS)


def downgrade() -> None:
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.execute("DROP VIEW visible_effects")
    op.drop_table("staged_rejects")
    op.drop_table("staged_results")
    op.create_table(
        "staged_effects",
        _uuid("run_id"),
        sa.Column("task_id", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("endpoint", sa.Text(), nullable=True),
        sa.Column("recipient", sa.Text(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("payload_sha256", sa.Text(), nullable=True),
        sa.Column("ordering_key", sa.Text(), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reject_reason", sa.Text(), nullable=True),
        sa.Column("raw_row", sa.Text(), nullable=True),
        sa.Column("chunk", sa.Integer(), server_default="0", nullable=False),
        prefixes=["UNLOGGED"],
    )
    op.create_table(
        "staged_results",
        _uuid("run_id"),
        sa.Column("task_id", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("row", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("chunk", sa.Integer(), server_default="0", nullable=False),
        prefixes=["UNLOGGED"],
    )
    for table in ("staged_effects", "staged_results"):
        op.create_index(
            op.f(f"ix_{table}_run_id_task_id_chunk"), table, ["run_id", "task_id", "chunk"]
        )
    op.create_table(
        "staged_chunks",
        _uuid("run_id"),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "run_id", "kind", "task_id", "chunk", name=op.f("pk_staged_chunks")
        ),
        prefixes=["UNLOGGED"],
    )
    op.drop_index(op.f("ix_deferred_effects_run_id"), table_name="deferred_effects")
    op.drop_table("deferred_effects")
    op.drop_column("batch_runs", "swept_at")
    op.drop_constraint(op.f("uq_batches_run_id"), "batches", type_="unique")
    op.drop_column("effects", "run_id")
    op.execute(OLD_CLAIMABLE_EFFECTS)
    op.execute(DUE_EFFECTS)
