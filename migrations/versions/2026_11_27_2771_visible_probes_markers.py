"""visible_effects probes the marker of each row it reads, never hashes them all.

As ``EXISTS``, the planner turned the marker check into a hash of every row of
``batches``, built for each statement: a claim of 500 effects of a Spark batch,
the status page's newest 200 effects per endpoint, each read all the markers
ever committed (a year of hourly batches per job is thousands; micro-batches,
millions). A scalar probe per row (uq_batches_run_id, ``LIMIT 1``) cannot be
hashed: a read costs what it reads, whatever the history.

Online and expand-only: the view keeps its columns (``CREATE OR REPLACE``); the
views built on it read it by name and need nothing.

Revision ID: 2771
Revises: 2770
Create Date: 2026-11-27 09:10:00
"""

from __future__ import annotations

from alembic import op

revision = "2771"
down_revision = "2770"
branch_labels = None
depends_on = None

_EXISTS = """
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id, e.expires_at
FROM effects e
WHERE e.run_id IS NULL
   OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
"""


# The view as this revision made it (objects/due.sql then): head's text has columns
# added since (2811), which a later revision adds.
_PROBED = """
CREATE OR REPLACE VIEW visible_effects AS
SELECT e.id, e.idempotency_key, e.job, e.batch_id, e.endpoint, e.recipient, e.payload,
       e.payload_sha256, e.ordering_key, e.state, e.attempt_count, e.next_attempt_at,
       e.lease_owner, e.lease_token, e.lease_expires_at, e.created_at, e.updated_at,
       e.delivered_at, e.last_error, e.reference, e.purged_at, e.run_id, e.supersedes,
       e.send_started_at, e.resend_action_id, e.expires_at
FROM effects e
WHERE e.run_id IS NULL
   OR (SELECT true FROM batches b WHERE b.run_id = e.run_id LIMIT 1);
"""


def upgrade() -> None:
    op.execute(_PROBED)


def downgrade() -> None:
    op.execute(_EXISTS)
