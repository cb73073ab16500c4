"""One word per concept; "claimable" and "due" defined once, as views.

Renames (docs/design.md, glossary):
- "attempt" means a delivery attempt only. The sink's try at committing a batch
  is a *run*: ``staging_attempts`` -> ``batch_runs``, every ``attempt_id`` ->
  ``run_id`` (batches, rejects, staging tables), with their index and key names.
- ``effects.attempts`` (a count) -> ``attempt_count``, so that ``attempts`` is
  the list of delivery attempts wherever it appears (API, pages).

Views, so the claim, the idle check and the queue metrics share one rule:
- ``claimable_effects``: waiting (pending, or leased with the lease running
  out), visible (enqueued outside Spark, or its batch committed) and not held
  back by a disabled endpoint. An unregistered endpoint's effect is claimable:
  the worker dead-letters it with the reason.
- ``due_effects``: claimable and due now (``next_attempt_at <= now()``).
Both are plain views, inlined by the planner: the claim still walks
``ix_effects_due`` in order and stops at its LIMIT (tests/dispatcher/test_store.py).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 07:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

CLAIMABLE_EFFECTS = """
CREATE VIEW claimable_effects AS
SELECT e.*
FROM effects e
WHERE e.state IN ('pending', 'leased')
  AND (e.job IS NULL OR EXISTS (
        SELECT 1 FROM batches b WHERE b.job = e.job AND b.batch_id = e.batch_id))
  -- NOT IN (a hashed filter) rather than a join: a scan in index order stays in
  -- order and stops at LIMIT.
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
"""

DUE_EFFECTS = """
CREATE VIEW due_effects AS
SELECT * FROM claimable_effects WHERE next_attempt_at <= now()
"""

# (table, old column, new column)
_COLUMNS = [
    ("batches", "attempt_id", "run_id"),
    ("rejects", "attempt_id", "run_id"),
    ("staged_effects", "attempt_id", "run_id"),
    ("staged_results", "attempt_id", "run_id"),
    ("staged_chunks", "attempt_id", "run_id"),
    ("staging_attempts", "attempt_id", "run_id"),
    ("effects", "attempts", "attempt_count"),
]
_INDEXES = [
    ("ix_staged_effects_attempt_id_task_id_chunk", "ix_staged_effects_run_id_task_id_chunk"),
    ("ix_staged_results_attempt_id_task_id_chunk", "ix_staged_results_run_id_task_id_chunk"),
]


def upgrade() -> None:
    for table, old, new in _COLUMNS:
        op.alter_column(table, old, new_column_name=new)
    for old, new in _INDEXES:
        op.execute(f"ALTER INDEX {old} RENAME TO {new}")
    op.rename_table("staging_attempts", "batch_runs")
    op.execute("ALTER TABLE batch_runs RENAME CONSTRAINT pk_staging_attempts TO pk_batch_runs")
    op.execute(
        "ALTER TABLE effects RENAME CONSTRAINT ck_effects_attempts_non_negative "
        "TO ck_effects_attempt_count_non_negative"
    )
    op.execute(CLAIMABLE_EFFECTS)
    op.execute(DUE_EFFECTS)


def downgrade() -> None:
    op.execute("DROP VIEW due_effects")
    op.execute("DROP VIEW claimable_effects")
    op.execute(
        "ALTER TABLE effects RENAME CONSTRAINT ck_effects_attempt_count_non_negative "
        "TO ck_effects_attempts_non_negative"
    )
    op.execute("ALTER TABLE batch_runs RENAME CONSTRAINT pk_batch_runs TO pk_staging_attempts")
    op.rename_table("batch_runs", "staging_attempts")
    for old, new in _INDEXES:
        op.execute(f"ALTER INDEX {new} RENAME TO {old}")
    for table, old, new in _COLUMNS:
        op.alter_column(table, new, new_column_name=old)
