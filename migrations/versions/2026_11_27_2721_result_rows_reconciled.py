"""Reconciliation re-reads the results table: what each batch wrote is kept.

- ``batches.results_table``, ``result_keys``, ``result_columns``, ``result_stamp``
  (NULL: no results, or committed before this revision): where the batch's result
  rows went, their conflict keys, the columns it wrote, and the columns that stamp
  a row with its batch (job, batch id) if the job declared them.
- ``batch_result_rows``: per result row a batch wrote, its conflict key (JSON) and
  the sha256 of the written columns as they stood after the merge, written in the
  commit transaction. Reconciliation compares them with the table now, naming
  missing, changed and foreign rows.

Expand only: a new table, nullable columns. A sink of the previous release
commits as before (its batches have no record: reconciliation says so).

Revision ID: 2721
Revises: 2720
Create Date: 2026-11-27 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "2721"
down_revision = "2720"
branch_labels = None
depends_on = None

BATCH_COLUMNS = ("results_table", "result_keys", "result_columns", "result_stamp")


def upgrade() -> None:
    op.execute("SET LOCAL lock_timeout = '10s'")
    op.add_column("batches", sa.Column("results_table", sa.Text()), if_not_exists=True)
    for name in BATCH_COLUMNS[1:]:
        op.add_column("batches", sa.Column(name, pg.ARRAY(sa.Text())), if_not_exists=True)
    op.create_table(
        "batch_result_rows",
        sa.Column("batch_ref", sa.BigInteger(), nullable=False),
        sa.Column("key", pg.JSONB(), nullable=False),
        sa.Column("row_sha256", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("batch_ref", "key", name=op.f("pk_batch_result_rows")),
        if_not_exists=True,
    )


def downgrade() -> None:
    op.drop_table("batch_result_rows")
    for name in BATCH_COLUMNS:
        op.drop_column("batches", name)
