"""The example job's results table, ``invoices``: the example's, not the outbox's.

The outbox schema (``spark_outbox.core.schema``) knows nothing of it. Its migration is
the Alembic branch ``billing`` (``outbox db upgrade billing@head``; the demo,
the tests and ``outbox spark run billing`` apply it themselves).
"""

from __future__ import annotations

import sqlalchemy as sa

from spark_outbox.core.schema import NAMING_CONVENTION

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

# One invoice per customer per day.
invoices = sa.Table(
    "invoices",
    metadata,
    sa.Column("invoice_id", sa.Text, primary_key=True),
    sa.Column("customer_id", sa.Text, nullable=False),
    sa.Column("invoice_date", sa.Date, nullable=False),
    sa.Column("currency", sa.Text, nullable=False),
    sa.Column("amount", sa.Numeric(18, 4), nullable=False),
    sa.Column("units", sa.BigInteger, nullable=False),
    sa.Column("event_count", sa.BigInteger, nullable=False),
    sa.Column("customer_email", sa.Text),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("batch_id", sa.Text, nullable=False),
    sa.Column(
        "updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")
    ),
    sa.Index(None, "customer_id", "invoice_date"),
    # Reconciliation's walk of one batch's rows in key order (migration 2722).
    sa.Index(None, "job", "batch_id", "invoice_id"),
)
