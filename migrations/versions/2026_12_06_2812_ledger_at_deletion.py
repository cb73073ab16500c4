"""A finished key enters the key ledger when its effect row is deleted, not at delivery.

The record statement wrote a ledger row for every delivery, in the same statement
that recorded it. While the effect row exists its unique key and its state already
keep the key from being enqueued or sent again, so that row was only needed once
retention deleted the effect; meanwhile it cost every delivery an insert into a
table that grows with the history (a random leaf of its key index per delivery:
the reason a drain beside 10M finished effects was slower than on an empty outbox).
Now a statement trigger on DELETE of ``effects`` writes the keys of the finished
effects the statement deleted, in its transaction (objects/ledger.sql), and the
record and retention's purge write none themselves.

Online and expand-only. The previous release keeps working during the upgrade: its
record still writes ledger rows at delivery (the trigger then finds them there), and
its purge, which wrote only dead, cancelled and expired keys, has the delivered ones
written by the trigger. CREATE TRIGGER holds a lock on ``effects`` that waits for
the writes in flight and holds the next ones for as long as it takes to add one
trigger: milliseconds. Nothing is backfilled: ledger rows of deliveries made before
the upgrade stay (the trigger leaves a key the ledger knows as it is).

The downgrade writes the keys of the delivered effects still in the table into the
ledger first, as the earlier release expects of every delivery, then drops the
trigger (in one transaction: no delivery recorded in between goes unwritten).

Revision ID: 2812
Revises: 2811
Create Date: 2026-12-06 04:00:00
"""

from __future__ import annotations

from alembic import op

from spark_outbox.core import objects

revision = "2812"
down_revision = "2811"
branch_labels = None
depends_on = None

# What the earlier release's record wrote for each delivery, for the deliveries
# recorded since this revision (keys already there stay as they are).
_BACKFILL = """
LOCK TABLE effects IN SHARE ROW EXCLUSIVE MODE;
INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at, finished_at)
SELECT idempotency_key, endpoint, payload_sha256, COALESCE(delivered_at, updated_at),
       COALESCE(delivered_at, updated_at)
FROM effects
WHERE state = 'delivered'
ORDER BY idempotency_key
ON CONFLICT (idempotency_key) DO NOTHING;
"""


def upgrade() -> None:
    op.execute(objects.concern("ledger"))


def downgrade() -> None:
    op.execute(_BACKFILL)
    op.execute("DROP TRIGGER IF EXISTS effects_keys_kept_on_delete ON effects")
    op.execute("DROP FUNCTION IF EXISTS effect_keys_to_ledger()")
