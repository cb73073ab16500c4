"""``rejects``: the batch index ends in ``id``, the keyset of ``GET /v1/rejects``.

``(job, batch_id)`` becomes ``(job, batch_id, id)``: a page of a batch's
rejects, newest first, is then one index range scan without a sort, as the
effects search is. The batch's reject count uses the same index.

Revision ID: 1501
Revises: 0004
Create Date: 2026-11-23 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = "1501"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        op.f("ix_rejects_job_batch_id_id"), "rejects", ["job", "batch_id", "id"], unique=False
    )
    op.drop_index(op.f("ix_rejects_job_batch_id"), table_name="rejects")


def downgrade() -> None:
    op.create_index(op.f("ix_rejects_job_batch_id"), "rejects", ["job", "batch_id"], unique=False)
    op.drop_index(op.f("ix_rejects_job_batch_id_id"), table_name="rejects")
