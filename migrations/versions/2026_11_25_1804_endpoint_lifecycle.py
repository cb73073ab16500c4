"""Endpoint lifecycle: archive, and several overlapping signing secrets.

- ``endpoints.archived_at`` and ``archived_reason``: an archived endpoint accepts
  no new effects (``enqueue`` and the Spark sink refuse them, naming it) and is
  paused, so no dispatcher claims for it; its effects and attempts stay, searchable.
- ``endpoint_secrets``: a rotation inside a running overlap used to overwrite
  ``previous_signing_secret``, so the secret before it stopped signing at once
  while receivers might still hold only it. Now the displaced secret moves here
  with its own ``not_after`` and keeps signing until then.

Revision ID: 1804
Revises: 1801
Create Date: 2026-11-25 18:04:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1804"
down_revision = "1801"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("archived_at", sa.DateTime(timezone=True)))
    op.add_column("endpoints", sa.Column("archived_reason", sa.Text()))
    op.create_table(
        "endpoint_secrets",
        sa.Column("id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("endpoint_id", sa.BigInteger(), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("not_after", sa.DateTime(timezone=True), nullable=False),
        sa.Column(
            "retired_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["endpoint_id"],
            ["endpoints.id"],
            name=op.f("fk_endpoint_secrets_endpoint_id_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoint_secrets")),
    )
    op.create_index(
        op.f("ix_endpoint_secrets_endpoint_id"), "endpoint_secrets", ["endpoint_id"], unique=False
    )


def downgrade() -> None:
    # Secrets of earlier rotations still overlapping stop signing: the old schema
    # holds one previous secret only.
    op.drop_index(op.f("ix_endpoint_secrets_endpoint_id"), table_name="endpoint_secrets")
    op.drop_table("endpoint_secrets")
    op.drop_column("endpoints", "archived_reason")
    op.drop_column("endpoints", "archived_at")
