"""Erasure may blank a person's data quoted in the operator audit trail.

``operator_actions`` stays append-only (no DELETE; no UPDATE of who, what,
when), but an erasure (``outbox erase``, spark_outbox.console.erasure) may
rewrite a row's ``target``, ``reason`` and ``details`` where they quote the
person: an operator's reason ("customer ann@example.com asked") or a filter
(a bulk requeue by recipient) would otherwise keep the data forever. The new
trigger function allows exactly that, inside the erasure's transaction only
(``outbox.erasure`` set to the id of its own ``erase`` row).

Revision ID: 1801
Revises: 1809
Create Date: 2026-11-25 18:01:00
"""

from __future__ import annotations

from alembic import op

from spark_outbox.core import objects

revision = "1801"
down_revision = "1809"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(objects.text("outbox_audit_redact_only"))
    op.execute(objects.text("operator_actions_append_only"))


def downgrade() -> None:
    op.execute("DROP TRIGGER operator_actions_append_only ON operator_actions")
    op.execute(
        "CREATE TRIGGER operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions "
        "FOR EACH ROW EXECUTE FUNCTION outbox_refuse_change()"
    )
    op.execute("DROP FUNCTION outbox_audit_redact_only()")
