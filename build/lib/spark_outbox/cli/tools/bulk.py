"""Load many effects and attempts fast (SQL generate_series): for EXPLAIN tests and the benches.

Shaped like production: effects arrive in Spark batches that share one
created_at; each recipient has a few effects across batches; every two effects
share a business reference (an invoice's webhook and e-mail); most effects are
delivered after retries, some dead, some pending.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

LOAD_SQL = """
INSERT INTO endpoints (name, kind, url, signing_secret)
VALUES ('billing-webhook', 'webhook', 'http://127.0.0.1:9/hook',
        'whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0')
ON CONFLICT (name) DO NOTHING;

INSERT INTO batches (job, batch_id, run_id, committed_at, result_rows, effects_total,
                     effects_new)
SELECT 'billing', 'b-' || b, gen_random_uuid(),
       now() - (:n_batches - b) * interval '5 minutes', :per_batch, :per_batch, :per_batch
FROM generate_series(1, :n_batches) b;

INSERT INTO effects (idempotency_key, job, batch_id, endpoint, recipient, reference, payload,
                     payload_sha256, state, attempt_count, created_at, updated_at, delivered_at,
                     next_attempt_at)
SELECT encode(sha256(convert_to('effect-' || i, 'UTF8')), 'hex'),
       'billing', 'b-' || ((i - 1) / :per_batch + 1), 'billing-webhook',
       'customer-' || (i % :n_recipients) || '@example.com',
       'INV-' || lpad(((i + 1) / 2)::text, 8, '0'),
       jsonb_build_object('invoice', 'inv-' || i, 'amount', i % 997,
                          'customer', jsonb_build_object('email', 'c' || i || '@example.com')),
       encode(sha256(convert_to('payload-' || i, 'UTF8')), 'hex'),
       CASE WHEN i % 20 = 0 THEN 'dead' WHEN i % 20 = 1 THEN 'pending' ELSE 'delivered' END,
       :attempts,
       b.committed_at, b.committed_at,
       CASE WHEN i % 20 > 1 THEN b.committed_at + interval '3 seconds' END,
       b.committed_at
FROM generate_series(1, :n_effects) i
JOIN batches b ON b.job = 'billing' AND b.batch_id = 'b-' || ((i - 1) / :per_batch + 1);

INSERT INTO delivery_attempts (effect_id, attempt, worker_id, started_at, duration_ms, outcome,
                               status_code, response_excerpt)
SELECT e.id, a, 'worker-1', e.created_at + a * interval '1 second', 10 + a,
       CASE WHEN a < :attempts OR e.state = 'pending' THEN 'retry'
            WHEN e.state = 'dead' THEN 'dead' ELSE 'delivered' END,
       CASE WHEN a < :attempts OR e.state = 'pending' THEN 503
            WHEN e.state = 'dead' THEN 400 ELSE 200 END,
       'excerpt of the answer'
FROM effects e CROSS JOIN generate_series(1, :attempts) a;
"""


def load(conn: Connection, *, effects: int, attempts: int = 3, per_batch: int = 1000) -> None:
    """``effects`` effects in batches of ``per_batch``, each with ``attempts`` attempts."""
    params = {
        "n_effects": effects,
        "per_batch": per_batch,
        "n_batches": max(1, -(-effects // per_batch)),
        "n_recipients": max(1, effects // 5),
        "attempts": attempts,
    }
    for statement in LOAD_SQL.split(";\n"):
        if statement.strip():
            conn.execute(sa.text(statement), params)


def recipient_of(i: int, effects: int) -> str:
    return f"customer-{i % max(1, effects // 5)}@example.com"


def reference_of(i: int) -> str:
    """The business reference of effect ``i``: two effects share one (invoice webhook
    and e-mail), like the example job's."""
    return f"INV-{(i + 1) // 2:08d}"
