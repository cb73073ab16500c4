"""The example's invoices by the batch that wrote them (branch ``billing``).

The billing job declares ``invoices.job`` and ``invoices.batch_id`` as its batch
columns (``ResultsSpec.batch_columns``): reconciliation looks for rows stamped with
a batch that the batch did not write, walking the batch's rows in key order. This
index serves that walk; without it each check would read the whole table. Built
``CONCURRENTLY``: the job keeps writing meanwhile.

Revision ID: 2722
Revises: b001
Create Date: 2026-11-27 14:30:00
"""

from __future__ import annotations

from alembic import op

revision = "2722"
down_revision = "b001"
branch_labels = None
depends_on = None

NAME = "ix_invoices_job_batch_id_invoice_id"


def upgrade() -> None:
    with op.get_context().autocommit_block():
        op.create_index(
            NAME,
            "invoices",
            ["job", "batch_id", "invoice_id"],
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index(NAME, table_name="invoices")
