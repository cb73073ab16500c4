"""Limits every dispatcher shares, failing streaks, and per-key ordering.

- ``endpoints.max_in_flight`` (NULL: no limit) and ``endpoints.ordered`` (opt-in
  per-key ordering).
- ``endpoint_budgets``: one row per endpoint (a trigger adds it with the
  endpoint) holding what all dispatchers share: the rate limit's token bucket
  (``tokens``, ``refilled_at``), the leased count for ``max_in_flight``
  (``in_flight``), and the failing streak behind the circuit breaker and the
  automatic disable (``failures``, ``failing_since``, ``resting_until``). The
  claim reads and writes it in its one statement (docs/dispatcher.md).
- ``ix_effects_due`` becomes ``(endpoint, next_attempt_at)``: the claim takes
  each endpoint's share from its own index range, so an endpoint held back by
  its budget is never walked.
- ``ix_effects_ordering``: unfinished effects that carry an ordering key, by
  ``(endpoint, ordering_key, created_at, id)``: the predecessor probe of the
  ordering rule. Rows without an ordering key never enter it.
- ``claimable_effects`` (revision 1321's, on ``visible_effects``) gains the
  ordering rule, re-created in place: on an ordered endpoint an
  effect waits while an earlier one (``created_at, id``) with its ordering key
  is unfinished (pending or leased). Effects without an ordering key, and every
  effect of an unordered endpoint, pass on the first test of the rule.

Revision ID: 1411
Revises: 1321
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1411"
down_revision = "1321"
branch_labels = None
depends_on = None

UNFINISHED = "state IN ('pending', 'leased')"
ORDERED_UNFINISHED = "ordering_key IS NOT NULL AND state IN ('pending', 'leased')"

# claimable_effects as revision 1321 made it (on visible_effects, held batches
# excluded); this revision adds the ordering rule to it and nothing else.
OLD_CLAIMABLE_EFFECTS = """
CREATE OR REPLACE VIEW claimable_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  -- NOT IN (a hashed filter) rather than a join: a scan in index order stays in
  -- order and stops at LIMIT.
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
  -- Held batches (the volume guard) wait for an operator; the same hashed filter,
  -- read from the partial index of held markers.
  AND (e.run_id IS NULL
       OR e.run_id NOT IN (SELECT b.run_id FROM batches b WHERE b.hold_state = 'held'))
"""

# Per-key ordering (opt-in per endpoint): wait while an earlier effect with the
# same ordering key on the endpoint is unfinished, visible or not yet (a run in
# flight may still commit it). One probe of ix_effects_ordering, and only for
# rows that carry a key on an ordered endpoint.
ORDERING_RULE = """
  AND (e.ordering_key IS NULL
       OR e.endpoint NOT IN (SELECT o.name FROM endpoints o WHERE o.ordered)
       OR NOT EXISTS (
            SELECT 1 FROM effects p
            WHERE p.endpoint = e.endpoint AND p.ordering_key = e.ordering_key
              AND p.state IN ('pending', 'leased')
              AND (p.created_at, p.id) < (e.created_at, e.id)))
"""

CLAIMABLE_EFFECTS = OLD_CLAIMABLE_EFFECTS.rstrip() + ORDERING_RULE

BUDGET_TRIGGER = """
CREATE FUNCTION endpoint_budget_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO endpoint_budgets (endpoint) VALUES (NEW.name) ON CONFLICT DO NOTHING;
    RETURN NEW;
END $$;
CREATE TRIGGER endpoints_budget_row AFTER INSERT ON endpoints
FOR EACH ROW EXECUTE FUNCTION endpoint_budget_row();
"""


def upgrade() -> None:
    op.add_column("endpoints", sa.Column("max_in_flight", sa.Integer(), nullable=True))
    op.add_column(
        "endpoints",
        sa.Column("ordered", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_endpoints_max_in_flight_positive"),
        "endpoints",
        "max_in_flight IS NULL OR max_in_flight > 0",
    )
    op.create_table(
        "endpoint_budgets",
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("tokens", sa.Float(), server_default="0", nullable=False),
        sa.Column(
            "refilled_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("in_flight", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("failing_since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resting_until", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["endpoint"],
            ["endpoints.name"],
            name=op.f("fk_endpoint_budgets_endpoint_endpoints"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("endpoint", name=op.f("pk_endpoint_budgets")),
    )
    op.execute("INSERT INTO endpoint_budgets (endpoint) SELECT name FROM endpoints")
    op.execute(BUDGET_TRIGGER)
    op.drop_index("ix_effects_due", table_name="effects", postgresql_where=sa.text(UNFINISHED))
    op.create_index(
        "ix_effects_due",
        "effects",
        ["endpoint", "next_attempt_at"],
        unique=False,
        postgresql_where=sa.text(UNFINISHED),
    )
    op.create_index(
        "ix_effects_ordering",
        "effects",
        ["endpoint", "ordering_key", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text(ORDERED_UNFINISHED),
    )
    op.execute(CLAIMABLE_EFFECTS)


def downgrade() -> None:
    op.execute(OLD_CLAIMABLE_EFFECTS)
    op.drop_index(
        "ix_effects_ordering", table_name="effects", postgresql_where=sa.text(ORDERED_UNFINISHED)
    )
    op.drop_index("ix_effects_due", table_name="effects", postgresql_where=sa.text(UNFINISHED))
    op.create_index(
        "ix_effects_due",
        "effects",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text(UNFINISHED),
    )
    op.execute("DROP TRIGGER endpoints_budget_row ON endpoints")
    op.execute("DROP FUNCTION endpoint_budget_row()")
    op.drop_table("endpoint_budgets")
    op.drop_constraint(op.f("ck_endpoints_max_in_flight_positive"), "endpoints")
    op.drop_column("endpoints", "ordered")
    op.drop_column("endpoints", "max_in_flight")
