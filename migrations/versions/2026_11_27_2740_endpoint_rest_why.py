"""Why an endpoint rests: when its current rest began, and what its last failure was.

- ``endpoint_budgets.resting_since``: when the circuit breaker's current rest began
  (NULL when the endpoint is not resting). The record statement sets it when a rest
  begins, not when one is extended, and writes one ``operator_actions`` row (actor
  ``system``, action ``rest_endpoint``) only then: one audit row per rest, exactly,
  whatever number of dispatchers record failures at once.
- ``endpoint_budgets.last_failure``: the last failed attempt of the streak, as our
  own words (``HTTP 503``, ``Timeout``), never the receiver's text: it is shown to
  the support role, and a receiver's text may echo a payload.

Both are NULLable and only written by the record statement on a failure or the
delivery that ends a streak; a dispatcher of the previous release leaves them as
they are (the status shows them only beside a streak or a rest that is current).

Revision ID: 2740
Revises: 2710
Create Date: 2026-11-27 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2740"
down_revision = "2710"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("endpoint_budgets", sa.Column("resting_since", sa.DateTime(timezone=True)))
    op.add_column("endpoint_budgets", sa.Column("last_failure", sa.Text()))


def downgrade() -> None:
    op.drop_column("endpoint_budgets", "last_failure")
    op.drop_column("endpoint_budgets", "resting_since")
