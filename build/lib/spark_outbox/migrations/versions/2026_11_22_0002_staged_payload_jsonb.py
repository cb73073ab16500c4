"""Staging for the pipelined commit: jsonb payloads, chunk tags, ``staged_chunks``.

- ``staged_effects.payload`` becomes jsonb: the JSON is parsed once, by the
  executors' COPY backends side by side, instead of again by the one serial
  commit transaction (``CAST(payload AS jsonb)``, ~2.8 s per million rows on the
  bench machine).
- Executors commit staging in chunks, each tagged in a ``chunk`` column and
  announced by a ``staged_chunks`` row in the same transaction; the commit
  transaction merges chunks while later ones are still being staged. The
  staging index becomes (attempt_id, task_id, chunk), what a chunk merge reads.

Staging rows are transient (a committed or swept attempt leaves none), so the
tables are changed in place.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 06:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE staged_effects ALTER COLUMN payload TYPE jsonb USING payload::jsonb")
    for table in ("staged_effects", "staged_results"):
        op.add_column(table, sa.Column("chunk", sa.Integer(), server_default="0", nullable=False))
        op.drop_index(op.f(f"ix_{table}_attempt_id"), table_name=table)
        op.create_index(
            op.f(f"ix_{table}_attempt_id_task_id_chunk"),
            table,
            ["attempt_id", "task_id", "chunk"],
            unique=False,
        )
    op.create_table(
        "staged_chunks",
        sa.Column("attempt_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), nullable=False),
        sa.Column("chunk", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "attempt_id", "kind", "task_id", "chunk", name=op.f("pk_staged_chunks")
        ),
        prefixes=["UNLOGGED"],
    )


def downgrade() -> None:
    op.drop_table("staged_chunks")
    for table in ("staged_effects", "staged_results"):
        op.drop_index(op.f(f"ix_{table}_attempt_id_task_id_chunk"), table_name=table)
        op.create_index(op.f(f"ix_{table}_attempt_id"), table, ["attempt_id"], unique=False)
        op.drop_column(table, "chunk")
    op.execute("ALTER TABLE staged_effects ALTER COLUMN payload TYPE text USING payload::text")
