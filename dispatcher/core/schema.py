"""The outbox schema as SQLAlchemy Core tables: the single description of it.

Alembic revisions in ``migrations/`` are written from these tables (a test runs
``alembic check`` so the two never drift). Runtime SQL lives in ``*.sql`` files
next to the code that runs it; these tables give it names and types.

Vocabulary: an effect is *enqueued* (``pending``), *claimed* under a *lease*
(``leased``), then *delivered*, *retried* (back to ``pending`` with a later
``next_attempt_at``), *dead* or *cancelled*, or *uncertain* (a send to an
endpoint that cannot deduplicate started and its outcome is unknown: an operator
decides), or *expired* (its send-by time, ``expires_at``, passed before it was
sent: never sent after it). A batch is *written* by a run, then
*committed* (its row in ``batches`` is the commit marker).

A lease is "``next_attempt_at`` pushed to the lease expiry": a ``leased`` row
whose ``next_attempt_at`` has passed is claimable again. One partial index,
``ix_effects_due`` (by endpoint, then due time), therefore serves both first
claims and expired-lease reclaims (except of a send that started: see
``send_started_at``).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from spark_outbox.core import bounds

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)

EFFECT_STATES = (
    "pending",
    "leased",
    "delivered",
    "dead",
    "cancelled",
    "uncertain",
    "expired",
)
ENDPOINT_KINDS = ("webhook", "email")
ROLES = ("support", "operator")
HOLD_STATES = ("held", "released", "cancelled")

NOW = sa.text("now()")

# The transaction advisory lock that serialises the final step of the sink's
# commits (and an enqueue that takes over an invisible row): while one holds it,
# no other run's marker commits, so "invisible" cannot turn "visible" mid-decision.
VISIBILITY_LOCK_ID = 0x6F7574626F78  # "outbox"


def _ts(name: str, *, nullable: bool = True, default_now: bool = False) -> sa.Column[object]:
    return sa.Column(
        name,
        sa.DateTime(timezone=True),
        nullable=nullable,
        server_default=NOW if default_now else None,
    )


endpoints = sa.Table(
    "endpoints",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("kind", sa.Text, nullable=False),
    # webhook
    sa.Column("url", sa.Text),
    sa.Column("signing_secret", sa.Text),
    # Secret rotation: the secret before the last rotation keeps signing (beside the
    # new one) until previous_secret_expires_at, so receivers can switch over.
    sa.Column("previous_signing_secret", sa.Text),
    _ts("previous_secret_expires_at"),
    # email
    sa.Column("smtp_host", sa.Text),
    sa.Column("smtp_port", sa.Integer),
    sa.Column("smtp_tls", sa.Text, nullable=False, server_default="none"),
    sa.Column("smtp_username", sa.Text),
    sa.Column("smtp_password", sa.Text),
    sa.Column("mail_from", sa.Text),
    # Credentials over a connection without TLS only when an operator said so.
    sa.Column("smtp_allow_plaintext_auth", sa.Boolean, nullable=False, server_default=sa.false()),
    # delivery policy
    sa.Column("timeout_s", sa.Float, nullable=False, server_default="10"),
    sa.Column("retry_schedule_s", pg.ARRAY(sa.Float)),  # NULL: the dispatcher's default
    sa.Column("rate_limit_per_s", sa.Float),  # NULL: unlimited (all dispatchers together)
    sa.Column("max_in_flight", sa.Integer),  # NULL: unlimited (all dispatchers together)
    # Per-key ordering: an effect waits for earlier unfinished ones with its ordering_key.
    sa.Column("ordered", sa.Boolean, nullable=False, server_default=sa.false()),
    # Does the receiver honour the idempotency key? If not, a send whose outcome is
    # unknown becomes 'uncertain' instead of being sent again (docs/dispatcher.md).
    # Left out of an insert: the kind's default (webhook true, e-mail false), set by
    # a trigger (migration 1311).
    sa.Column("deduplicates", sa.Boolean, nullable=False),
    sa.Column("enabled", sa.Boolean, nullable=False, server_default=sa.true()),
    sa.Column("paused_reason", sa.Text),
    _ts("paused_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    # Retired (migration 1804): accepts no new effects, its history stays; archived
    # endpoints are also paused (enabled false), so no dispatcher claims for them.
    _ts("archived_at"),
    sa.Column("archived_reason", sa.Text),
    sa.CheckConstraint(f"kind IN {ENDPOINT_KINDS!r}", name="kind"),
    sa.CheckConstraint("smtp_tls IN ('none', 'starttls', 'tls')", name="smtp_tls"),
    sa.CheckConstraint(
        "kind <> 'webhook' OR (url IS NOT NULL AND signing_secret IS NOT NULL)",
        name="webhook_has_url_and_secret",
    ),
    sa.CheckConstraint(
        "kind <> 'email' OR (smtp_host IS NOT NULL AND smtp_port IS NOT NULL "
        "AND mail_from IS NOT NULL)",
        name="email_has_smtp",
    ),
    # Every numeric setting within its bound (dispatcher/bounds.py, migration 1525):
    # a row written by SQL directly cannot break the claim all endpoints share.
    *(
        sa.CheckConstraint(bounds.sql_check(b), name=f"{b.field}_bounds")
        for b in bounds.BOUNDS.values()
    ),
    sa.CheckConstraint(bounds.RETRY_SCHEDULE_CHECK, name="retry_schedule_s_bounds"),
)

# What every dispatcher shares about an endpoint, one row each (a trigger adds it
# with the endpoint), written by the claim and the record statements: the rate
# limit's token bucket, the leased count behind max_in_flight (kept only while
# the endpoint has one), and the failing streak behind the circuit breaker and
# the automatic disable. Machine state, apart from the audited configuration.
# Signing secrets retired by a rotation before the previous one's overlap ended
# (migration 1804): each keeps signing, beside signing_secret and
# previous_signing_secret, until its not_after. Rows past it are pruned by the
# next rotation; nothing reads them after not_after.
endpoint_secrets = sa.Table(
    "endpoint_secrets",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column(
        "endpoint_id",
        sa.BigInteger,
        sa.ForeignKey("endpoints.id", ondelete="CASCADE"),
        nullable=False,
        index=True,
    ),
    sa.Column("secret", sa.Text, nullable=False),
    _ts("not_after", nullable=False),
    _ts("retired_at", nullable=False, default_now=True),
)

endpoint_budgets = sa.Table(
    "endpoint_budgets",
    metadata,
    sa.Column(
        "endpoint",
        sa.Text,
        sa.ForeignKey("endpoints.name", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("tokens", sa.Float, nullable=False, server_default="0"),
    _ts("refilled_at", nullable=False, default_now=True),
    sa.Column("in_flight", sa.Integer, nullable=False, server_default="0"),
    # Failed attempts since the last delivery, and when the first of them started.
    sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
    _ts("failing_since"),
    # The circuit breaker: no dispatcher claims for the endpoint before this.
    _ts("resting_until"),
    # When the current rest began (one audit row per rest), and the streak's last
    # failure in our own words ("HTTP 503", "Timeout"): why it rests (migration 2740).
    _ts("resting_since"),
    sa.Column("last_failure", sa.Text),
    # What the claim computes from (migration 1525): a negative count overflowed
    # max_in_flight - in_flight, an infinite refill time the refill's subtraction.
    sa.CheckConstraint("in_flight >= 0", name="in_flight_non_negative"),
    sa.CheckConstraint("isfinite(refilled_at)", name="refilled_at_finite"),
)

# The batch-commit marker. Its insert is the fence: the unique (job, batch_id)
# lets exactly one run of a batch commit.
batches = sa.Table(
    "batches",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("batch_id", sa.Text, nullable=False),
    sa.Column("run_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("spark_app_id", sa.Text),
    _ts("committed_at", nullable=False, default_now=True),
    sa.Column("result_rows", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("effects_total", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("effects_new", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("effects_deduplicated", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("payload_mismatches", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("rejects", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("duration_s", sa.Float),
    # The batch's new effects per endpoint ({"endpoint": n}): the volume guard's
    # baseline is read from recent markers (spark_outbox.spark.guard). NULL before 1321.
    sa.Column("effects_new_by_endpoint", pg.JSONB),
    # The volume guard: NULL (never held), held (committed, visible, not claimable:
    # claimable_effects excludes it), released or cancelled by an operator.
    sa.Column("hold_state", sa.Text),
    sa.Column("hold_reason", sa.Text),
    _ts("hold_resolved_at"),
    # The batch's span (W3C traceparent/tracestate; NULL with tracing off): its
    # effects' sends join this trace (spark_outbox.core.tracing, migration 2730).
    sa.Column("trace_parent", sa.Text),
    sa.Column("trace_state", sa.Text),
    # Where the batch's result rows went (migration 2721; NULL: no results, or
    # committed before): the results table, its conflict keys, the columns the
    # batch wrote, and the columns (job, batch id) that stamp a row with the batch
    # that wrote it, if the table has them (ResultsSpec.batch_columns).
    # Reconciliation re-reads the table with them (dispatcher/console/results.py).
    sa.Column("results_table", sa.Text),
    sa.Column("result_keys", pg.ARRAY(sa.Text)),
    sa.Column("result_columns", pg.ARRAY(sa.Text)),
    sa.Column("result_stamp", pg.ARRAY(sa.Text)),
    # The batch's effects retention deleted (migration 2772): reconciliation explains
    # the rows that left with it.
    sa.Column("effects_purged", sa.BigInteger, nullable=False, server_default="0"),
    sa.CheckConstraint(f"hold_state IN {HOLD_STATES!r}", name="hold_state"),
    sa.UniqueConstraint("job", "batch_id"),
    # An effect written by a run is visible once that run's marker exists
    # (the visible_effects view looks the marker up by run_id).
    sa.UniqueConstraint("run_id"),
    sa.Index(None, "job", "committed_at"),
    # /v1/status and /metrics: recent batches with payload mismatches (rare).
    sa.Index(
        "ix_batches_committed_at_mismatched",
        "committed_at",
        postgresql_where=sa.text("payload_mismatches > 0"),
    ),
    # The claim's exclusion of held batches probes this tiny index.
    sa.Index("ix_batches_run_id_held", "run_id", postgresql_where=sa.text("hold_state = 'held'")),
)

# What each batch wrote to its results table (migration 2721), one row per result
# row, in the commit transaction: the row's conflict key (a JSON object of the key
# columns) and the sha256 of the columns the batch wrote as they stood after its
# merge (the text of ROW(...) under fixed settings: spark_outbox.core.results_digest).
# Reconciliation compares it with what the table holds now, naming rows that are
# missing or changed; a later batch that wrote the same key explains a change.
# No foreign key to batches (the commit's cost per row); retention drops the rows
# of batches older than its horizon.
batch_result_rows = sa.Table(
    "batch_result_rows",
    metadata,
    sa.Column("batch_ref", sa.BigInteger, nullable=False),  # batches.id
    sa.Column("key", pg.JSONB, nullable=False),
    sa.Column("row_sha256", sa.Text, nullable=False),
    # The only index: a batch's rows in key order (reconciliation's chunks), and one
    # probe per later batch for "did a later batch write this key?" (asked of changed
    # rows only). A second index by key cost the commit's merge ~12 us a row more
    # (bench/bench_results.py's statement, measured on 200,000 rows).
    sa.PrimaryKeyConstraint("batch_ref", "key"),
)

# The outbox. No foreign key to endpoints on purpose: endpoints are never
# deleted (only disabled), names are checked on the way in, and a per-row
# RI trigger would cost the one-transaction batch merge dearly.
effects = sa.Table(
    "effects",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("job", sa.Text),  # NULL for effects enqueued outside Spark
    sa.Column("batch_id", sa.Text),
    # The sink's run that wrote the row (NULL for enqueue): the row is visible
    # only once that run's marker exists (migration 1201, view visible_effects).
    sa.Column("run_id", pg.UUID(as_uuid=True)),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("recipient", sa.Text),
    sa.Column("payload", pg.JSONB, nullable=False),
    sa.Column("payload_sha256", sa.Text, nullable=False),
    sa.Column("ordering_key", sa.Text),
    # A business reference a customer would quote (an invoice number): support
    # finds effects by it. Optional; at most MAX_REFERENCE_CHARS.
    sa.Column("reference", sa.Text),
    # A correction: the key of the effect this one supersedes (an earlier revision
    # of the same business event, spark_outbox.core.keys.effect_key(..., revision=n)).
    sa.Column("supersedes", sa.Text),
    sa.Column("state", sa.Text, nullable=False, server_default="pending"),
    sa.Column("attempt_count", sa.Integer, nullable=False, server_default="0"),
    _ts("next_attempt_at", nullable=False, default_now=True),
    # The send-by time (migration 2720): optional; once it has passed the effect is
    # never sent (no claim takes it, no send starts after it) and ends 'expired'.
    _ts("expires_at"),
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_token", pg.UUID(as_uuid=True)),
    _ts("lease_expires_at"),
    # Written durably before a send to a non-deduplicating endpoint starts, cleared
    # by its record: a lease that expires with it set ends 'uncertain', not resent.
    _ts("send_started_at"),
    _ts("created_at", nullable=False, default_now=True),
    _ts("updated_at", nullable=False, default_now=True),
    _ts("delivered_at"),
    sa.Column("last_error", sa.Text),
    # A stub: an erasure blanked the row (or an older release's retention dropped the
    # payload and attempts). Retention deletes it once it finished before its cutoff.
    _ts("purged_at"),
    # An operator's resend (``operator_actions.id``, the latest one): the claim sends
    # the effect although the key ledger knows it delivered, and its attempts carry
    # the same id (spark_outbox.console.resend; migration 2710).
    sa.Column("resend_action_id", sa.BigInteger),
    # The span that enqueued it (enqueue with tracing on; NULL otherwise and for a
    # Spark run's rows, whose context is their batch's): its sends join that trace.
    sa.Column("trace_parent", sa.Text),
    sa.Column("trace_state", sa.Text),
    sa.UniqueConstraint("idempotency_key"),
    sa.CheckConstraint(f"state IN {EFFECT_STATES!r}", name="state"),
    sa.CheckConstraint("char_length(idempotency_key) = 64", name="key_length"),
    sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="payload_is_object"),
    sa.CheckConstraint("attempt_count >= 0", name="attempt_count_non_negative"),
    sa.CheckConstraint("(job IS NULL) = (batch_id IS NULL)", name="job_and_batch_together"),
    # Claiming: due rows only, per endpoint in due order (each endpoint's share of a
    # claim is one range of it). Small, because finished rows leave it.
    sa.Index(
        "ix_effects_due",
        "endpoint",
        "next_attempt_at",
        postgresql_where=sa.text("state IN ('pending', 'leased')"),
    ),
    # Per-key ordering: the probe for an earlier unfinished effect with the same key.
    # Rows without an ordering key never enter it (the unordered path pays nothing).
    sa.Index(
        "ix_effects_ordering",
        "endpoint",
        "ordering_key",
        "created_at",
        "id",
        postgresql_where=sa.text("ordering_key IS NOT NULL AND state IN ('pending', 'leased')"),
    ),
    # settle_uncertain: leases of started sends by expiry (only sends in flight).
    sa.Index(
        "ix_effects_send_started",
        "lease_expires_at",
        postgresql_where=sa.text("state = 'leased' AND send_started_at IS NOT NULL"),
    ),
    # Audit lookups. Each ends in (created_at, id), the keyset of the search's
    # ORDER BY created_at DESC, id DESC: rows of one batch share created_at
    # (one transaction's now()), so id breaks ties inside the index, not in a sort.
    sa.Index(None, "job", "batch_id", "created_at", "id"),
    sa.Index(None, "endpoint", "created_at", "id"),
    sa.Index(
        None,
        "recipient",
        "created_at",
        "id",
        postgresql_where=sa.text("recipient IS NOT NULL"),
    ),
    sa.Index(None, "state", "created_at", "id"),
    sa.Index(
        None,
        "reference",
        "created_at",
        "id",
        postgresql_where=sa.text("reference IS NOT NULL"),
    ),
    # The audit's "superseded by": corrections of an effect (rare, so partial).
    sa.Index(None, "supersedes", postgresql_where=sa.text("supersedes IS NOT NULL")),
    # Retention: finished rows, oldest finish first. A row enters it once, when it
    # finishes, and leaves when retention deletes it (stubs have ix_effects_stubs).
    sa.Index(
        "ix_effects_purgeable",
        "updated_at",
        "id",
        postgresql_where=sa.text(
            "purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')"
        ),
    ),
    # Send-by times (migration 2720): the unfinished effects that have one, by it:
    # what the dispatcher's expiry pass reads (effects without one never enter it).
    sa.Index(
        "ix_effects_expiring",
        "expires_at",
        postgresql_where=sa.text("expires_at IS NOT NULL AND state IN ('pending', 'leased')"),
    ),
    # Expired effects not yet purged, by when they expired: retention's second range
    # (ix_effects_purgeable predates the state) and /metrics' recent count. Expired
    # rows are few, and a row enters it only when it expires.
    sa.Index(
        "ix_effects_expired",
        "updated_at",
        "id",
        postgresql_where=sa.text("state = 'expired' AND purged_at IS NULL"),
    ),
    # Retention: the stubs an erasure or an older release's purge left, by finish
    # (migration 2772); only stubs enter it, so the hot path never writes it.
    sa.Index(
        "ix_effects_stubs",
        "updated_at",
        "id",
        postgresql_where=sa.text("purged_at IS NOT NULL"),
    ),
    # Recover: an endpoint's dead effects by when they died (dead rows are few).
    sa.Index(
        "ix_effects_dead_endpoint_updated_at",
        "endpoint",
        "updated_at",
        postgresql_where=sa.text("state = 'dead'"),
    ),
)

delivery_attempts = sa.Table(
    "delivery_attempts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    # An effect's id; no foreign key: its check cost ~8 us of PostgreSQL a delivery
    # and guarded nothing the writers do not (migration 2001).
    sa.Column("effect_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("worker_id", sa.Text, nullable=False),
    sa.Column("lease_token", pg.UUID(as_uuid=True)),
    _ts("started_at", nullable=False),
    sa.Column("duration_ms", sa.Float, nullable=False),
    # delivered | retry | dead | gone | uncertain | stale (the lease had been lost) |
    # expired (its send-by time passed before the first byte: not sent)
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("status_code", sa.Integer),
    sa.Column("error_class", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("response_excerpt", sa.Text),
    # Set on an attempt an operator's resend asked for (``operator_actions.id``): a
    # resend is recorded as such, never mistaken for a duplicate on our own account.
    sa.Column("resend_action_id", sa.BigInteger),
    # The attempt's send span (W3C traceparent; NULL with tracing off): the support
    # page shows its trace id and links to a trace viewer.
    sa.Column("trace_parent", sa.Text),
    sa.Index(None, "effect_id", "attempt"),
    sa.Index(None, "started_at"),
)

LEDGER_STATES = ("delivered", "dead", "cancelled", "expired")

# Finished keys stay known here, so they are never enqueued or sent again once
# their effect rows are gone: written by the trigger on every DELETE of effects
# (objects/ledger.sql: retention's purge), by an erasure and by an operator's
# "mark delivered"; until the ledger's horizon,
# if an operator set one (retention forgets older keys). Only ``delivered`` rows
# make the claim settle an effect without sending it.
key_ledger = sa.Table(
    "key_ledger",
    metadata,
    sa.Column("idempotency_key", sa.Text, primary_key=True),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("payload_sha256", sa.Text, nullable=False),
    _ts("delivered_at"),
    sa.Column("state", sa.Text, nullable=False, server_default="delivered"),
    _ts("finished_at", nullable=False, default_now=True),
    sa.CheckConstraint(f"state IN {LEDGER_STATES!r}", name="state"),
    sa.CheckConstraint(
        "state <> 'delivered' OR delivered_at IS NOT NULL", name="delivered_has_delivered_at"
    ),
    # The ledger's horizon: keys forgotten oldest first (migration 2772).
    sa.Index(None, "finished_at"),
)

rejects = sa.Table(
    "rejects",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("batch_id", sa.Text, nullable=False),
    sa.Column("run_id", pg.UUID(as_uuid=True)),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("raw_row", pg.JSONB, nullable=False),
    _ts("rejected_at", nullable=False, default_now=True),
    # Set when an unknown-endpoint reject was enqueued again (spark_outbox.console.rejects.requeue).
    _ts("requeued_at"),
    # Ends in id: the keyset of a batch's rejects page (GET /v1/rejects).
    sa.Index(None, "job", "batch_id", "id"),
)

api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("role", sa.Text, nullable=False),
    # sha256 of the token: tokens are long random strings, so a fast hash is enough.
    sa.Column("token_sha256", sa.Text, nullable=False, unique=True),
    _ts("created_at", nullable=False, default_now=True),
    _ts("last_used_at"),
    _ts("revoked_at"),
    sa.CheckConstraint(f"role IN {ROLES!r}", name="role"),
)

# Append-only: a trigger installed by the migration refuses UPDATE and DELETE.
operator_actions = sa.Table(
    "operator_actions",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    _ts("at", nullable=False, default_now=True),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("details", pg.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
    sa.Index(None, "at"),
)

# enqueue()'s payload mismatches: a key enqueued again with another payload keeps
# the first one; the event is kept here (no payload, nothing personal) so status and
# metrics count it beside the sink's marker counts (migration 1809).
enqueue_mismatches = sa.Table(
    "enqueue_mismatches",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    _ts("at", nullable=False, default_now=True),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("stored_sha256", sa.Text, nullable=False),
    sa.Column("offered_sha256", sa.Text, nullable=False),
    sa.Index(None, "at"),
)

# How many effects each (endpoint, state, run) holds, kept by the statement
# triggers of objects/counts.sql (migration 2770): rows are only inserted by
# writers (a change of +n or -n), folded by the dispatchers into one row per
# group (spark_outbox.core.counts), summed by /v1/status and /metrics, so no read
# counts the history. run_id: the Spark run whose rows these are (NULL: enqueued);
# they count once the run has a marker.
effect_counts = sa.Table(
    "effect_counts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("run_id", pg.UUID(as_uuid=True)),
    sa.Column("n", sa.BigInteger, nullable=False),
)

# Attempts per minute and outcome (migration 2773), kept by a statement trigger on
# delivery_attempts (objects/counts.sql) as effect_counts is: the status page's
# throughput and chart sum these; the dispatchers fold them and drop minutes past
# the chart's longest range.
attempt_counts = sa.Table(
    "attempt_counts",
    metadata,
    sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
    _ts("minute", nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("n", sa.BigInteger, nullable=False),
    sa.Index(None, "minute"),
)

# The queue's figures per endpoint as the last full count found them (migration
# 2813, core/queue.py): beside a due backlog of a million effects a count took
# ~200 ms, every /v1/status, scrape and dispatcher heartbeat. One row: `figures`
# is {endpoint: [due now, oldest due age s]}, `taken_at` when it was counted.
queue_snapshot = sa.Table(
    "queue_snapshot",
    metadata,
    sa.Column("id", sa.SmallInteger, primary_key=True, autoincrement=False),
    sa.Column("figures", pg.JSONB, nullable=False),
    _ts("taken_at", nullable=False),
    sa.CheckConstraint("id = 1", name="one_row"),
)

worker_heartbeats = sa.Table(
    "worker_heartbeats",
    metadata,
    sa.Column("worker_id", sa.Text, primary_key=True),
    sa.Column("hostname", sa.Text, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    _ts("started_at", nullable=False, default_now=True),
    _ts("last_seen_at", nullable=False, default_now=True),
    sa.Column("in_flight", sa.Integer, nullable=False, server_default="0"),
    sa.Column("delivered", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("failed", sa.BigInteger, nullable=False, server_default="0"),
    _ts("stopped_at"),
)

# Effects a run met already written by another run that had no marker (dead, or
# still in flight): kept whole, never swallowed. The run's commit takes each
# over if its owner still has no marker, or counts it deduplicated if it has.
deferred_effects = sa.Table(
    "deferred_effects",
    metadata,
    sa.Column("run_id", pg.UUID(as_uuid=True), nullable=False),
    # The Spark task that met the key: the commit reads only the succeeded tasks'.
    sa.Column("task_id", sa.BigInteger, nullable=False),
    sa.Column("idempotency_key", sa.Text, nullable=False),
    sa.Column("endpoint", sa.Text, nullable=False),
    sa.Column("recipient", sa.Text),
    sa.Column("payload", pg.JSONB, nullable=False),
    sa.Column("payload_sha256", sa.Text, nullable=False),
    sa.Column("ordering_key", sa.Text),
    sa.Column("reference", sa.Text),
    sa.Column("supersedes", sa.Text),
    sa.Column("not_before", sa.DateTime(timezone=True)),
    sa.Column("expires_at", sa.DateTime(timezone=True)),
    sa.Index(None, "run_id"),
)

# Staging for what still goes through the commit transaction: result rows (they
# go into the user's table) and rejects. UNLOGGED (re-creatable, no WAL), tagged
# with the run and the Spark task that wrote them: the commit reads only rows
# of the tasks Spark saw succeed, so a retried task's leftovers are never used.
staged_results = sa.Table(
    "staged_results",
    metadata,
    sa.Column("run_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("task_id", sa.BigInteger, nullable=False),
    sa.Column("row", pg.JSONB, nullable=False),
    sa.Index(None, "run_id", "task_id"),
    prefixes=["UNLOGGED"],
)

staged_rejects = sa.Table(
    "staged_rejects",
    metadata,
    sa.Column("run_id", pg.UUID(as_uuid=True), nullable=False),
    sa.Column("task_id", sa.BigInteger, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("raw_row", pg.JSONB, nullable=False),
    sa.Index(None, "run_id", "task_id"),
    prefixes=["UNLOGGED"],
)

# Runs that began writing: one sink try at committing a batch. The commit deletes
# its run's row; a row left here is a run in flight or dead. The sweeper sets
# swept_at before deleting a dead run's rows, which fences that run's commit.
batch_runs = sa.Table(
    "batch_runs",
    metadata,
    sa.Column("run_id", pg.UUID(as_uuid=True), primary_key=True),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("batch_id", sa.Text, nullable=False),
    _ts("started_at", nullable=False, default_now=True),
    _ts("swept_at"),
)
