"""Every numeric endpoint setting within its bound, held by the database.

One endpoint's ``rate_limit_per_s`` of 1e308 overflowed the claim that all
endpoints share (the token refill multiplies it): every claim failed, for every
endpoint, and the worker stopped. The API and the CLI now refuse such input
(``dispatcher/bounds.py``); these CHECK constraints hold the same bounds for a
row written by SQL directly, so no single endpoint row can break the claim for
the others. Chosen over clamping in the claim: the hot path stays as it is,
every reader of a setting (the claim, the retry schedule, the send timeout) is
covered, and a wrong value is refused when written rather than read as another.

- ``timeout_s``: more than 0, at most 600 (was: more than 0)
- ``rate_limit_per_s``: NULL or 0.001 to 1000000
- ``max_in_flight``: NULL or 1 to 100000 (was: more than 0)
- ``smtp_port``: NULL or 1 to 65535
- ``retry_schedule_s``: NULL or 1 to 50 delays, each 0 to 2592000 (30 days)

And the two numbers of ``endpoint_budgets`` (machine state) the claim computes
from: ``in_flight`` at least 0 (a very negative count overflowed
``max_in_flight - in_flight``) and a finite ``refilled_at`` (an infinite one
failed the refill's subtraction); rows outside are repaired (0, now), as a
resume would.

NaN is above every number in PostgreSQL, so each upper bound refuses it too.
An endpoint already outside a bound stops the upgrade with its name and the
command that fixes it (nothing is changed behind an operator's back).

Revision ID: 1525
Revises: 2001
Create Date: 2026-11-25 15:25:00
"""

from __future__ import annotations

from alembic import op

revision = "1525"
down_revision = "2001"
branch_labels = None
depends_on = None

# (constraint name, condition, the CLI option that fixes a row outside it)
BOUNDS = [
    (
        "timeout_s_bounds",
        "timeout_s IS NULL OR (timeout_s > 0 AND timeout_s <= 600)",
        "--timeout-s",
    ),
    (
        "rate_limit_per_s_bounds",
        "rate_limit_per_s IS NULL OR (rate_limit_per_s >= 0.001 AND rate_limit_per_s <= 1000000)",
        "--rate-limit-per-s",
    ),
    (
        "max_in_flight_bounds",
        "max_in_flight IS NULL OR (max_in_flight >= 1 AND max_in_flight <= 100000)",
        "--max-in-flight",
    ),
    (
        "smtp_port_bounds",
        "smtp_port IS NULL OR (smtp_port >= 1 AND smtp_port <= 65535)",
        "UPDATE endpoints SET smtp_port = ...",
    ),
    (
        "retry_schedule_s_bounds",
        "retry_schedule_s IS NULL OR (array_ndims(retry_schedule_s) = 1"
        " AND cardinality(retry_schedule_s) BETWEEN 1 AND 50"
        " AND array_position(retry_schedule_s, NULL) IS NULL"
        " AND 0 <= ALL (retry_schedule_s) AND 2592000 >= ALL (retry_schedule_s))",
        "--retry-schedule",
    ),
]
BUDGETS = [
    ("in_flight_non_negative", "in_flight >= 0"),
    ("refilled_at_finite", "isfinite(refilled_at)"),
]
OLD = [
    ("timeout_positive", "timeout_s > 0"),
    ("max_in_flight_positive", "max_in_flight IS NULL OR max_in_flight > 0"),
]


def upgrade() -> None:
    # A DO block, not a Python check: `outbox db sql` prints this revision too.
    found = " UNION ALL ".join(
        f"SELECT name || ' ({name.removesuffix('_bounds')}: {fix})' AS e FROM endpoints"
        f" WHERE NOT COALESCE({condition}, true)"
        for name, condition, fix in ((n, c, o.replace("'", "''")) for n, c, o in BOUNDS)
    )
    op.execute(
        f"""DO $$
DECLARE outside text;
BEGIN
    SELECT string_agg(e, ', ') INTO outside FROM ({found}) f;
    IF outside IS NOT NULL THEN
        RAISE EXCEPTION 'endpoint settings outside their bounds: %; change each with '
            '`outbox endpoints update NAME OPTION VALUE` (docs/dispatcher.md lists the bounds), '
            'then run the upgrade again', outside;
    END IF;
END $$"""
    )
    for name, _ in OLD:
        op.drop_constraint(op.f(f"ck_endpoints_{name}"), "endpoints")
    for name, condition, _ in BOUNDS:
        op.create_check_constraint(op.f(f"ck_endpoints_{name}"), "endpoints", condition)
    op.execute(
        "UPDATE endpoint_budgets SET in_flight = GREATEST(in_flight, 0),"
        " refilled_at = CASE WHEN isfinite(refilled_at) THEN refilled_at ELSE now() END"
        " WHERE in_flight < 0 OR NOT isfinite(refilled_at)"
    )
    for name, condition in BUDGETS:
        op.create_check_constraint(
            op.f(f"ck_endpoint_budgets_{name}"), "endpoint_budgets", condition
        )


def downgrade() -> None:
    for name, _ in BUDGETS:
        op.drop_constraint(op.f(f"ck_endpoint_budgets_{name}"), "endpoint_budgets")
    for name, _, _ in BOUNDS:
        op.drop_constraint(op.f(f"ck_endpoints_{name}"), "endpoints")
    for name, condition in OLD:
        op.create_check_constraint(op.f(f"ck_endpoints_{name}"), "endpoints", condition)
