"""Trace context: an effect remembers the trace it was created in; an attempt, its span.

- ``effects.trace_parent`` / ``trace_state``: the W3C ``traceparent`` and
  ``tracestate`` of the span that enqueued the effect (``enqueue`` with tracing
  on). NULL when tracing was off, and on effects a Spark run wrote: theirs is
  their batch's (below), found through ``run_id``, so the executors write
  nothing more per row.
- ``batches.trace_parent`` / ``trace_state``: the batch's span, written with the
  marker; every effect of the batch joins that trace when it is sent.
- ``delivery_attempts.trace_parent``: the attempt's own send span (the trace
  id the support page shows and links to a trace viewer).

Expand only: nullable columns without a default are a catalog change (no
rewrite, no long lock); the previous release neither reads nor writes them.

Revision ID: 2730
Revises: 1804
Create Date: 2026-11-27 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2730"
down_revision = "2740"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("effects", "trace_parent"),
    ("effects", "trace_state"),
    ("batches", "trace_parent"),
    ("batches", "trace_state"),
    ("delivery_attempts", "trace_parent"),
)


def upgrade() -> None:
    for table, column in _COLUMNS:
        op.add_column(table, sa.Column(column, sa.Text(), nullable=True))


def downgrade() -> None:
    for table, column in reversed(_COLUMNS):
        op.drop_column(table, column)
