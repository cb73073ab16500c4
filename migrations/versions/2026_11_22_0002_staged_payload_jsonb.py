"""Staged payloads as jsonb: the JSON is parsed by the staging COPY, in parallel.

The sink's executors COPY canonical payload text into ``staged_effects``. As
text, every payload was parsed again by the one commit transaction's
``CAST(payload AS jsonb)``, serially (~2.8 s per million rows on the bench
machine). As jsonb it is parsed once, by the executors' COPY backends, side by
side, and the commit only copies the value.

Staging rows are transient (a committed or swept attempt leaves none), so the
column is converted in place.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 06:10:00
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE staged_effects ALTER COLUMN payload TYPE jsonb USING payload::jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE staged_effects ALTER COLUMN payload TYPE text USING payload::text")
