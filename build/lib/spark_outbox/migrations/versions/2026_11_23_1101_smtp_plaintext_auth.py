"""``endpoints.smtp_allow_plaintext_auth``: SMTP credentials cross a connection
without TLS only when an operator opted in for that endpoint.

Existing endpoints are not opted in: one that sends a password with
``smtp_tls = 'none'`` has its e-mails dead-lettered with the reason
(``PlaintextAuthRefused``) until it is switched to ``starttls``/``tls`` or
opted in explicitly; docs/dispatcher.md says how.

Revision ID: 1101
Revises: 1403
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1101"
down_revision = "1403"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "endpoints",
        sa.Column(
            "smtp_allow_plaintext_auth",
            sa.Boolean(),
            server_default=sa.false(),
            nullable=False,
        ),
    )


def downgrade() -> None:
    op.drop_column("endpoints", "smtp_allow_plaintext_auth")
