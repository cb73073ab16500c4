"""Webhook secret rotation with overlap: the previous secret and when it stops signing.

During the overlap every delivery carries a signature from both secrets
(``webhook-signature: v1,<new> v1,<old>``); after ``previous_secret_expires_at``
only the new one.

Revision ID: 1401
Revises: 1501
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1401"
down_revision = "1501"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("previous_signing_secret", sa.Text(), nullable=True))
    op.add_column(
        "endpoints",
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("endpoints", "previous_secret_expires_at")
    op.drop_column("endpoints", "previous_signing_secret")
