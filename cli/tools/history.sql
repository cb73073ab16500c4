-- A year of outbox history in miniature (cli/tools/history.py): one chunk of
-- effects :lo..:hi, with what the running system would have written beside them.
-- Effects are numbered :first .. :first + :n_effects - 1 (a second history loads
-- beside a first with other numbers). Every statement is a pure function of its
-- parameters, so chunks load side by side on several connections.

-- name: endpoints
-- The three destinations every effect goes to (names the other statements use).
INSERT INTO endpoints (name, kind, url, signing_secret)
VALUES ('billing-webhook', 'webhook', 'http://127.0.0.1:9/hook',
        'whsec_dGVzdHRlc3R0ZXN0dGVzdHRlc3R0ZXN0'),
       ('partner-webhook', 'webhook', 'http://127.0.0.1:9/partner',
        'whsec_cGFydG5lcnBhcnRuZXJwYXJ0bmVycGFydG5l')
ON CONFLICT (name) DO NOTHING;
INSERT INTO endpoints (name, kind, smtp_host, smtp_port, mail_from)
VALUES ('billing-email', 'email', '127.0.0.1', 9, 'billing@example.com')
ON CONFLICT (name) DO NOTHING;

-- name: batches
-- The markers: one committed Spark batch per :per_batch effects, spread evenly over
-- :days days up to :now (a batch about every 50 minutes for 10M effects a year).
INSERT INTO batches (job, batch_id, run_id, committed_at, result_rows, effects_total,
                     effects_new, rejects, duration_s, effects_new_by_endpoint)
SELECT 'billing', 'b-' || b, md5('run-' || b)::uuid,
       CAST(:now AS timestamptz) - make_interval(days => :days)
           + (b - 1 - (CAST(:first AS bigint) - 1) / :per_batch)
             * (make_interval(days => :days) / CEIL(CAST(:n_effects AS float8) / :per_batch)),
       -- nine in ten of a batch's range are the job's (the tenth: a partner's, no batch)
       :per_batch, :per_batch * 9 / 10, :per_batch * 9 / 10, 5, 2.5,
       jsonb_build_object('billing-webhook', :per_batch * 6 / 10, 'billing-email', :per_batch * 3 / 10)
FROM generate_series((CAST(:lo AS bigint) - 1) / :per_batch + 1, (CAST(:hi AS bigint) - 1) / :per_batch + 1) b;

-- name: effects
-- Six in ten to the billing webhook and three in ten by e-mail, written by the
-- billing job's batches; one in ten to a partner, enqueued by an application
-- (no batch). Two effects share an invoice reference; a recipient has five
-- effects across the year. 95% delivered, 4% dead, 1% cancelled; effects of the
-- last day before the load (real time) that are not delivered yet wait for a retry
-- an hour from the load (pending, not due: the benches' fresh bursts are the only
-- due work). In the same statement,
-- every attempt (1 to 5, 3 on average; the last one of a delivered or dead effect
-- its outcome, 200 or 400; the others 503s, retried) and the key ledger of a year with
-- retention: as many delivered keys as this chunk delivers, of effects purged before
-- the year the table holds (keys no effect row has: a purge wrote them; since
-- migration 2812 a delivery whose row is still there has no ledger row).
WITH e AS (
    INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, recipient, reference,
                         payload, payload_sha256, state, attempt_count, created_at, updated_at,
                         delivered_at, next_attempt_at, last_error)
    SELECT encode(sha256(convert_to('effect-' || i, 'UTF8')), 'hex'),
           CASE WHEN i % 10 < 9 THEN 'billing' END,
           CASE WHEN i % 10 < 9 THEN 'b-' || ((i - 1) / :per_batch + 1) END,
           CASE WHEN i % 10 < 9 THEN md5('run-' || ((i - 1) / :per_batch + 1))::uuid END,
           CASE WHEN i % 10 < 6 THEN 'billing-webhook' WHEN i % 10 < 9 THEN 'billing-email'
                ELSE 'partner-webhook' END,
           'customer-' || (i % GREATEST(1, :n_effects / 5)) || '@example.com',
           'INV-' || lpad(((i + 1) / 2)::text, 8, '0'),
           jsonb_build_object('type', 'invoice.created', 'invoice', 'INV-' || lpad(((i + 1) / 2)::text, 8, '0'),
                              'amount', (i % 99991) / 100.0, 'currency', 'EUR',
                              'customer', jsonb_build_object('id', 'cus_' || (i % GREATEST(1, :n_effects / 5)),
                                                             'email', 'customer-' || (i % GREATEST(1, :n_effects / 5)) || '@example.com',
                                                             'name', 'Customer ' || (i % 7919)),
                              'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (i % 613), 'qty', 1 + i % 4),
                                                         jsonb_build_object('sku', 'SKU-' || (i % 409), 'qty', 1)),
                              'due_date', to_char(t.at + interval '30 days', 'YYYY-MM-DD')),
           encode(sha256(convert_to('payload-' || i, 'UTF8')), 'hex'),
           s.state, 1 + i % 5, t.at, t.at + (1 + i % 5) * interval '7 seconds',
           CASE WHEN s.state = 'delivered' THEN t.at + (1 + i % 5) * interval '7 seconds' END,
           CASE WHEN s.state = 'pending' THEN now() + interval '1 hour'
                ELSE t.at + (1 + i % 5) * interval '7 seconds' END,
           CASE WHEN s.state = 'dead' THEN 'HTTP 400: {"error": "invalid invoice"}'
                WHEN s.state = 'cancelled' THEN 'cancelled by an operator' END
    FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint)) i
    CROSS JOIN LATERAL (
        SELECT CAST(:now AS timestamptz) - make_interval(days => :days)
               + ((i - CAST(:first AS bigint)) / :per_batch)
                 * (make_interval(days => :days) / CEIL(CAST(:n_effects AS float8) / :per_batch)) AS at
    ) t
    CROSS JOIN LATERAL (
        SELECT CASE WHEN i % 100 < 4 THEN CASE WHEN t.at > now() - interval '1 day'
                                               THEN 'pending' ELSE 'dead' END
                    WHEN i % 100 = 4 THEN 'cancelled'
                    ELSE 'delivered' END AS state
    ) s
    RETURNING id, idempotency_key, endpoint, payload_sha256, state, attempt_count, created_at,
              delivered_at
), attempts AS (
    INSERT INTO delivery_attempts (effect_id, attempt, worker_id, lease_token, started_at,
                                   duration_ms, outcome, status_code, error_class, error,
                                   response_excerpt)
    SELECT e.id, a, 'dispatcher-' || (e.id % 4) || '@host-' || (e.id % 3),
           md5('lease-' || e.id || '-' || a)::uuid,
           e.created_at + a * interval '7 seconds' - interval '5 seconds', 12.5 + (e.id + a) % 40,
           CASE WHEN NOT f.final THEN 'retry' ELSE e.state END,
           CASE WHEN NOT f.final THEN 503 WHEN e.state = 'delivered' THEN 200 ELSE 400 END,
           CASE WHEN NOT f.final THEN 'HTTPStatus' END,
           CASE WHEN NOT f.final THEN 'HTTP 503'
                WHEN e.state = 'dead' THEN 'HTTP 400: {"error": "invalid invoice"}' END,
           CASE WHEN NOT f.final THEN '{"error": "unavailable"}'
                WHEN e.state = 'delivered' THEN '{"received": true}'
                ELSE '{"error": "invalid invoice"}' END
    FROM e CROSS JOIN generate_series(1, e.attempt_count) a
    -- the last attempt of a delivered or dead effect is its outcome; a cancelled
    -- or pending one's attempts were all retried
    CROSS JOIN LATERAL (SELECT a = e.attempt_count AND e.state IN ('delivered', 'dead')
                        AS final) f
), ledger AS (
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at, state,
                            finished_at)
    SELECT encode(sha256(convert_to('purged-' || idempotency_key, 'UTF8')), 'hex'), endpoint,
           payload_sha256, delivered_at, 'delivered', delivered_at
    FROM e WHERE state = 'delivered'
)
SELECT count(*) FROM e;

-- name: rejects
-- Five rows a batch broke the effect contract (the markers count them).
INSERT INTO rejects (job, batch_id, run_id, reason, raw_row, rejected_at)
SELECT b.job, b.batch_id, b.run_id, 'recipient: not an e-mail address',
       jsonb_build_object('invoice_id', b.batch_id || '-' || r, 'email', 'not-an-address-' || r,
                          'amount', r * 10),
       b.committed_at
FROM batches b CROSS JOIN generate_series(1, 5) r
WHERE b.job = 'billing'
  AND b.batch_id IN (SELECT 'b-' || g FROM generate_series((CAST(:lo AS bigint) - 1) / :per_batch + 1,
                                                           (CAST(:hi AS bigint) - 1) / :per_batch + 1) g);

-- name: burst
-- A fresh batch as the sink commits it: :n pending effects of :endpoint numbered
-- from :first (keys, recipients, references and payloads shaped as the history's),
-- tagged with their run, and the marker that makes them visible, in one statement.
WITH marker AS (
    INSERT INTO batches (job, batch_id, run_id, result_rows, effects_total, effects_new,
                         effects_new_by_endpoint)
    VALUES ('billing', 'burst-' || :first, md5('burst-' || :first)::uuid, :n, :n, :n,
            jsonb_build_object(CAST(:endpoint AS text), :n))
    RETURNING job, batch_id, run_id
)
INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, recipient, reference,
                     payload, payload_sha256)
SELECT encode(sha256(convert_to('effect-' || i, 'UTF8')), 'hex'), m.job, m.batch_id, m.run_id,
       :endpoint, 'customer-' || (i % :recipients) || '@example.com',
       'INV-' || lpad(((i + 1) / 2)::text, 8, '0'),
       jsonb_build_object('type', 'invoice.created', 'invoice', 'INV-' || lpad(((i + 1) / 2)::text, 8, '0'),
                          'amount', (i % 99991) / 100.0, 'currency', 'EUR',
                          'customer', jsonb_build_object('id', 'cus_' || (i % :recipients),
                                                         'email', 'customer-' || (i % :recipients) || '@example.com',
                                                         'name', 'Customer ' || (i % 7919)),
                          'lines', jsonb_build_array(jsonb_build_object('sku', 'SKU-' || (i % 613), 'qty', 1 + i % 4),
                                                     jsonb_build_object('sku', 'SKU-' || (i % 409), 'qty', 1)),
                          'due_date', to_char(now() + interval '30 days', 'YYYY-MM-DD')),
       encode(sha256(convert_to('payload-' || i, 'UTF8')), 'hex')
FROM marker m CROSS JOIN generate_series(CAST(:first AS bigint), CAST(:first AS bigint) + :n - 1) i;
