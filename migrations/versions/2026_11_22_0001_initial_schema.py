"""Initial schema: endpoints, batches, effects, attempts, ledger, rejects, tokens, staging.

Written from dispatcher/schema.py by autogenerate, then edited by hand: the
append-only trigger on operator_actions is not something autogenerate sees.
The head of the ``outbox`` branch is the outbox schema; the example job's
``invoices`` table is not part of it (its own ``billing`` branch, b001). Before
any release this revision also created ``invoices``: it was taken out here, not
dropped by a later revision, since no deployment exists to migrate.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 02:38:28.655292
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = ("outbox",)
depends_on = None

APPEND_ONLY_FUNCTION = """
CREATE FUNCTION outbox_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("token_sha256", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("role IN ('support', 'operator')", name=op.f("ck_api_tokens_role")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("name", name=op.f("uq_api_tokens_name")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_api_tokens_token_sha256")),
    )
    op.create_table(
        "batches",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.UUID(), nullable=False),
        sa.Column("spark_app_id", sa.Text(), nullable=True),
        sa.Column(
            "committed_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("result_rows", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("effects_total", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("effects_new", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("effects_deduplicated", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("payload_mismatches", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("rejects", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
        sa.UniqueConstraint("job", "batch_id", name=op.f("uq_batches_job_batch_id")),
    )
    op.create_index(
        op.f("ix_batches_job_committed_at"), "batches", ["job", "committed_at"], unique=False
    )
    op.create_table(
        "effects",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("job", sa.Text(), nullable=True),
        sa.Column("batch_id", sa.Text(), nullable=True),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("recipient", sa.Text(), nullable=True),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column("ordering_key", sa.Text(), nullable=True),
        sa.Column("state", sa.Text(), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "next_attempt_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.Column("lease_token", sa.UUID(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "jsonb_typeof(payload) = 'object'", name=op.f("ck_effects_payload_is_object")
        ),
        sa.CheckConstraint(
            "state IN ('pending', 'leased', 'delivered', 'dead', 'cancelled')",
            name=op.f("ck_effects_state"),
        ),
        sa.CheckConstraint(
            "(job IS NULL) = (batch_id IS NULL)", name=op.f("ck_effects_job_and_batch_together")
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_effects_attempts_non_negative")),
        sa.CheckConstraint("char_length(idempotency_key) = 64", name=op.f("ck_effects_key_length")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_effects")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_effects_idempotency_key")),
    )
    op.create_index(
        "ix_effects_due",
        "effects",
        ["next_attempt_at"],
        unique=False,
        postgresql_where=sa.text("state IN ('pending', 'leased')"),
    )
    op.create_index(
        op.f("ix_effects_endpoint_created_at_id"),
        "effects",
        ["endpoint", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_effects_job_batch_id_created_at_id"),
        "effects",
        ["job", "batch_id", "created_at", "id"],
        unique=False,
    )
    op.create_index(
        op.f("ix_effects_recipient_created_at_id"),
        "effects",
        ["recipient", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text("recipient IS NOT NULL"),
    )
    op.create_index(
        op.f("ix_effects_state_created_at_id"),
        "effects",
        ["state", "created_at", "id"],
        unique=False,
    )
    op.create_table(
        "endpoints",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("url", sa.Text(), nullable=True),
        sa.Column("signing_secret", sa.Text(), nullable=True),
        sa.Column("smtp_host", sa.Text(), nullable=True),
        sa.Column("smtp_port", sa.Integer(), nullable=True),
        sa.Column("smtp_tls", sa.Text(), server_default="none", nullable=False),
        sa.Column("smtp_username", sa.Text(), nullable=True),
        sa.Column("smtp_password", sa.Text(), nullable=True),
        sa.Column("mail_from", sa.Text(), nullable=True),
        sa.Column("timeout_s", sa.Float(), server_default="10", nullable=False),
        sa.Column("retry_schedule_s", postgresql.ARRAY(sa.Float()), nullable=True),
        sa.Column("rate_limit_per_s", sa.Float(), nullable=True),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("paused_reason", sa.Text(), nullable=True),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "kind <> 'email' OR (smtp_host IS NOT NULL AND smtp_port IS NOT NULL AND mail_from IS NOT NULL)",
            name=op.f("ck_endpoints_email_has_smtp"),
        ),
        sa.CheckConstraint(
            "kind <> 'webhook' OR (url IS NOT NULL AND signing_secret IS NOT NULL)",
            name=op.f("ck_endpoints_webhook_has_url_and_secret"),
        ),
        sa.CheckConstraint("kind IN ('webhook', 'email')", name=op.f("ck_endpoints_kind")),
        sa.CheckConstraint(
            "smtp_tls IN ('none', 'starttls', 'tls')", name=op.f("ck_endpoints_smtp_tls")
        ),
        sa.CheckConstraint("timeout_s > 0", name=op.f("ck_endpoints_timeout_positive")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_endpoints")),
        sa.UniqueConstraint("name", name=op.f("uq_endpoints_name")),
    )
    op.create_table(
        "key_ledger",
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("endpoint", sa.Text(), nullable=False),
        sa.Column("payload_sha256", sa.Text(), nullable=False),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("idempotency_key", name=op.f("pk_key_ledger")),
    )
    op.create_table(
        "operator_actions",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "details",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_operator_actions")),
    )
    op.create_index(op.f("ix_operator_actions_at"), "operator_actions", ["at"], unique=False)
    # The operator audit trail is append-only: refuse UPDATE and DELETE.
    op.execute(APPEND_ONLY_FUNCTION)
    op.execute(
        "CREATE TRIGGER operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions "
        "FOR EACH ROW EXECUTE FUNCTION outbox_refuse_change()"
    )
    op.create_table(
        "rejects",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column("attempt_id", sa.UUID(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("raw_row", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column(
            "rejected_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rejects")),
    )
    op.create_index(op.f("ix_rejects_job_batch_id"), "rejects", ["job", "batch_id"], unique=False)
    op.create_table(
        "staged_effects",
        sa.Column("attempt_id", sa.UUID(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=True),
        sa.Column("endpoint", sa.Text(), nullable=True),
        sa.Column("recipient", sa.Text(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.Column("payload_sha256", sa.Text(), nullable=True),
        sa.Column("ordering_key", sa.Text(), nullable=True),
        sa.Column("not_before", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reject_reason", sa.Text(), nullable=True),
        sa.Column("raw_row", sa.Text(), nullable=True),
        prefixes=["UNLOGGED"],
    )
    op.create_index(
        op.f("ix_staged_effects_attempt_id"), "staged_effects", ["attempt_id"], unique=False
    )
    op.create_table(
        "staged_results",
        sa.Column("attempt_id", sa.UUID(), nullable=False),
        sa.Column("task_id", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("row", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        prefixes=["UNLOGGED"],
    )
    op.create_index(
        op.f("ix_staged_results_attempt_id"), "staged_results", ["attempt_id"], unique=False
    )
    op.create_table(
        "staging_attempts",
        sa.Column("attempt_id", sa.UUID(), nullable=False),
        sa.Column("job", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.Text(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("attempt_id", name=op.f("pk_staging_attempts")),
    )
    op.create_table(
        "worker_heartbeats",
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("hostname", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "started_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "last_seen_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("in_flight", sa.Integer(), server_default="0", nullable=False),
        sa.Column("delivered", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("failed", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("worker_id", name=op.f("pk_worker_heartbeats")),
    )
    op.create_table(
        "delivery_attempts",
        sa.Column("id", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("effect_id", sa.BigInteger(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Text(), nullable=False),
        sa.Column("lease_token", sa.UUID(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("response_excerpt", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["effect_id"],
            ["effects.id"],
            name=op.f("fk_delivery_attempts_effect_id_effects"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_delivery_attempts")),
    )
    op.create_index(
        op.f("ix_delivery_attempts_effect_id_attempt"),
        "delivery_attempts",
        ["effect_id", "attempt"],
        unique=False,
    )
    op.create_index(
        op.f("ix_delivery_attempts_started_at"), "delivery_attempts", ["started_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_delivery_attempts_started_at"), table_name="delivery_attempts")
    op.drop_index(op.f("ix_delivery_attempts_effect_id_attempt"), table_name="delivery_attempts")
    op.drop_table("delivery_attempts")
    op.drop_table("worker_heartbeats")
    op.drop_table("staging_attempts")
    op.drop_index(op.f("ix_staged_results_attempt_id"), table_name="staged_results")
    op.drop_table("staged_results")
    op.drop_index(op.f("ix_staged_effects_attempt_id"), table_name="staged_effects")
    op.drop_table("staged_effects")
    op.drop_index(op.f("ix_rejects_job_batch_id"), table_name="rejects")
    op.drop_table("rejects")
    op.execute("DROP TRIGGER operator_actions_append_only ON operator_actions")
    op.execute("DROP FUNCTION outbox_refuse_change()")
    op.drop_index(op.f("ix_operator_actions_at"), table_name="operator_actions")
    op.drop_table("operator_actions")
    op.drop_table("key_ledger")
    op.drop_table("endpoints")
    op.drop_index(op.f("ix_effects_state_created_at_id"), table_name="effects")
    op.drop_index(
        op.f("ix_effects_recipient_created_at_id"),
        table_name="effects",
        postgresql_where=sa.text("recipient IS NOT NULL"),
    )
    op.drop_index(op.f("ix_effects_job_batch_id_created_at_id"), table_name="effects")
    op.drop_index(op.f("ix_effects_endpoint_created_at_id"), table_name="effects")
    op.drop_index(
        "ix_effects_due",
        table_name="effects",
        postgresql_where=sa.text("state IN ('pending', 'leased')"),
    )
    op.drop_table("effects")
    op.drop_index(op.f("ix_batches_job_committed_at"), table_name="batches")
    op.drop_table("batches")
    op.drop_table("api_tokens")
