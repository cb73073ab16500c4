"""The example job's ``invoices`` table, on its own branch (``billing``).

Not part of the outbox schema: ``outbox db upgrade`` migrates the ``outbox``
branch only; the demo, the tests and ``outbox spark run billing`` also apply
this one (``billing@head``). Written from spark_jobs/billing_schema.py.
A database made before the table left the outbox's first revision already has
it: then there is nothing to create.

Revision ID: b001
Revises:
Create Date: 2026-11-23 06:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "b001"
down_revision = None
branch_labels = ("billing",)
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("invoices"):
        return
    op.create_table(
        "invoices",
        sa.Column("invoice_id", sa.Text(), nullable=False),
        sa.Column("customer_id", sa.Text(), nullable=False),
        sa.Column("invoice_date", sa.Date(), nullable=False),
        sa.Column("currency", sa.Text(), nullable=False),
        sa.Column("amount", sa.Numeric(precision=18, scale=4), nullable=False),
        sa.Column("units", sa.BigInteger(), nullable=False),
        sa.Column("event_count", sa.BigInteger(), nullable=False),
        sa.Column("customer_email", sa.Text(), nullable=True),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("invoice_id", name=op.f("pk_invoices")),
    )
    op.create_index(
        op.f("ix_invoices_customer_id_invoice_date"),
        "invoices",
        ["customer_id", "invoice_date"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_invoices_customer_id_invoice_date"), table_name="invoices")
    op.drop_table("invoices")
