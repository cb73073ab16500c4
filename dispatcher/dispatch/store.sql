-- name: claim
-- Lease up to :limit due effects (first claims and expired leases alike; the
-- due_effects view is the one definition of "due"), taking each endpoint's share
-- from its own range of ix_effects_due. Each endpoint with something due gets a
-- fair share (:limit over their number, rounded up) and the rows are taken round
-- robin (each endpoint's first, then its second, ...) up to :limit, so a fresh
-- effect is claimed beside a backlog of another endpoint, not after it (a claim
-- taking endpoints in turn until :limit gave the backlog the whole batch in
-- half the claims); `capped` says an endpoint had more due than its fair share
-- (the worker claims again at once). SKIP LOCKED lets any number of
-- workers claim side by side. Limits hold for all dispatchers together: an
-- endpoint with a rate limit or max_in_flight has its endpoint_budgets row locked
-- and spent in this same statement (its share is at most the tokens left and the
-- room under max_in_flight); a resting (circuit breaker) or paused endpoint gets
-- no share, and an endpoint held back is never walked. An effect delivered before
-- (its row's delivered_at, or its key in the key ledger) is marked delivered here
-- instead of leased: never sent twice by us. An
-- operator's resend (resend_action_id) is the one exception: it is sent, and
-- counted like any lease (rate, max_in_flight), because an operator asked for it.
WITH RECURSIVE present(endpoint) AS (
    -- The endpoints with unfinished effects, one descent of ix_effects_due each
    -- (a loose index scan): idle endpoints cost nothing, unregistered ones are
    -- found too (the worker dead-letters their effects with the reason).
    SELECT min(f.endpoint) FROM effects f WHERE f.state IN ('pending', 'leased')
    UNION ALL
    SELECT (SELECT min(f.endpoint) FROM effects f
            WHERE f.state IN ('pending', 'leased') AND f.endpoint > p.endpoint)
    FROM present p WHERE p.endpoint IS NOT NULL
), turns AS (
    SELECT p.endpoint, ep.rate_limit_per_s AS rate_per_s, ep.max_in_flight,
           (ep.rate_limit_per_s IS NOT NULL OR ep.max_in_flight IS NOT NULL) AS limited,
           COALESCE(ep.ordered, false) AS ordered,
           -- :limit shared by the endpoints with a due row: each one's earliest, one
           -- descent of ix_effects_due (the ORDER BY keeps it there: an EXISTS was
           -- planned as a sequential scan of effects)
           CAST(ceil(:limit / GREATEST(1.0, count(*) FILTER (WHERE (
               SELECT f.next_attempt_at FROM effects f
               WHERE f.endpoint = p.endpoint AND f.state IN ('pending', 'leased')
               ORDER BY f.next_attempt_at LIMIT 1) <= now()) OVER ())) AS int) AS fair
    FROM present p
    LEFT JOIN endpoints ep ON ep.name = p.endpoint
    LEFT JOIN endpoint_budgets b ON b.endpoint = p.endpoint
    WHERE p.endpoint IS NOT NULL
      -- Paused endpoints' rows are not due (the view); skipping them here keeps a
      -- paused endpoint's backlog from being walked on every claim.
      AND COALESCE(ep.enabled, true)
      AND (b.resting_until IS NULL OR b.resting_until <= now())
    ORDER BY random()
), due AS (
    -- A limited endpoint's budget row is locked before its share is computed, so
    -- two dispatchers never spend the same tokens (the lock lasts one statement);
    -- while another claim holds it, this claim skips the endpoint (share 0): a
    -- claim never waits for a lock.
    SELECT t.endpoint, t.limited, t.max_in_flight IS NOT NULL AS counted, s.tokens, s.at,
           e.id, e.idempotency_key, e.state, e.resend_action_id, e.delivered_at,
           -- the fair share bound and was filled: more of this endpoint may be due
           share.n >= t.fair AND count(*) OVER (PARTITION BY t.endpoint) >= share.n AS capped,
           row_number() OVER (PARTITION BY t.endpoint) AS turn
    FROM turns t
    LEFT JOIN LATERAL (
        -- The bucket refilled to this moment (NULL without a rate limit), the room
        -- under max_in_flight (NULL without one): the share is the least of them.
        SELECT CASE WHEN t.rate_per_s IS NOT NULL THEN
                   LEAST(GREATEST(1.0, t.rate_per_s),
                         b.tokens + t.rate_per_s * GREATEST(0.0, EXTRACT(
                             EPOCH FROM clock_timestamp() - b.refilled_at)))
               END AS tokens,
               t.max_in_flight - b.in_flight AS room,
               clock_timestamp() AS at
        FROM endpoint_budgets b
        WHERE b.endpoint = t.endpoint AND t.limited
        FOR UPDATE OF b SKIP LOCKED
    ) s ON true
    CROSS JOIN LATERAL (
        -- The endpoint's share: (LEAST ignores NULLs: a limit the endpoint does not
        -- have.) No budget row in hand (another claim holds it): no share this time.
        SELECT CASE WHEN NOT t.limited THEN t.fair
                    WHEN s.at IS NULL THEN 0
                    ELSE GREATEST(0, LEAST(t.fair, floor(s.tokens), s.room))
               END AS n
    ) share
    CROSS JOIN LATERAL (
        -- Unordered: the endpoint's range of ix_effects_due in due order, each row
        -- locked as it is reached, until the share is taken.
        SELECT u.id, u.idempotency_key, u.state, u.resend_action_id, u.delivered_at
        FROM (SELECT e.id, e.idempotency_key, e.state, e.resend_action_id, e.delivered_at
              FROM due_effects e
              WHERE NOT t.ordered AND e.endpoint = t.endpoint
              ORDER BY e.next_attempt_at
              LIMIT share.n
              FOR UPDATE OF e SKIP LOCKED) u
        UNION ALL
        -- Ordered: only the front :window due rows are looked at, and of each key
        -- only its earliest there (a later one has an earlier unfinished effect: that
        -- one), probed for an earlier unfinished effect of its key and, if claimable,
        -- locked by its id, in due order. A claim's cost stays bounded however deep a
        -- key is before the parking pass parks its waiting effects (which looks at the
        -- same front): 100,000 waiting effects of one key took 634-771 ms a claim,
        -- each walked and probed; probing each of the front's 1,000 took ~8 ms.
        SELECT o.id, o.idempotency_key, o.state, o.resend_action_id, o.delivered_at
        FROM (SELECT c.id, c.idempotency_key, c.state, c.resend_action_id, c.delivered_at
              FROM (SELECT k.id, k.row_ctid FROM (
                        SELECT DISTINCT ON (COALESCE(w.ordering_key, CAST(w.id AS text)))
                               w.id, w.next_attempt_at, w.row_ctid
                        FROM (SELECT f.id, f.ordering_key, f.created_at, f.next_attempt_at,
                                     f.ctid AS row_ctid
                              FROM effects f
                              WHERE t.ordered AND f.endpoint = t.endpoint
                                AND f.state IN ('pending', 'leased')
                                AND f.next_attempt_at <= now()
                              ORDER BY f.next_attempt_at
                              LIMIT :window) w
                        ORDER BY COALESCE(w.ordering_key, CAST(w.id AS text)), w.created_at,
                                 w.id) k
                    ORDER BY k.next_attempt_at) front
              CROSS JOIN LATERAL (
                  -- Found by its row's address as the window read it (then by id),
                  -- not by id alone: the due condition is also ix_effects_due's range,
                  -- and statistics taken while nothing was due made that range (then
                  -- every due row: 28,000 in the bench) the cheapest path to one id,
                  -- an 8.2-s claim. A TID scan is priced below any index's. A row
                  -- changed since the window read it is never claimed as it was: the
                  -- lock reaches its newest version, checked again (a row it passes
                  -- over is due at the next claim).
                  SELECT e.id, e.idempotency_key, e.state, e.resend_action_id, e.delivered_at
                  FROM due_effects e
                  WHERE e.row_ctid = front.row_ctid AND e.id = front.id
                  OFFSET 0
                  FOR UPDATE OF e SKIP LOCKED) c
              LIMIT share.n) o
    ) e
    ORDER BY turn
    LIMIT :limit
), known AS MATERIALIZED (
    -- Delivered before: the row says so (its delivered_at: a delivered effect made
    -- pending again by hand, as a bug or a restore might), or the key ledger does
    -- (the key of an effect row deleted since). One probe of the ledger's key index
    -- per claimed row that its own row does not settle: a join here let the
    -- planner hash the whole ledger on every claim (O(ledger) per claim). A resend
    -- skips both: the operator asked for this send of a delivered key.
    SELECT k.id, k.capped, COALESCE(k.own, k.ledger) AS delivered_at,
           k.own IS NULL AND k.ledger IS NOT NULL AS in_ledger
    FROM (SELECT due.id, due.capped,
                 CASE WHEN due.resend_action_id IS NULL THEN due.delivered_at END AS own,
                 CASE WHEN due.resend_action_id IS NULL AND due.delivered_at IS NULL THEN
                     (SELECT l.delivered_at FROM key_ledger l
                      WHERE l.idempotency_key = due.idempotency_key
                        AND l.state = 'delivered') END AS ledger
          FROM due) k
), spent AS (
    -- The limited endpoints' budgets: tokens taken (refilled to this moment first),
    -- and the newly leased rows counted while max_in_flight is set.
    UPDATE endpoint_budgets b SET
        tokens = COALESCE(n.tokens - n.taken, b.tokens),
        refilled_at = CASE WHEN n.tokens IS NULL THEN b.refilled_at ELSE n.at END,
        in_flight = b.in_flight + n.leased
    FROM (SELECT due.endpoint, max(due.tokens) AS tokens, max(due.at) AS at, count(*) AS taken,
                 count(*) FILTER (WHERE due.counted AND due.state = 'pending'
                                    AND known.delivered_at IS NULL) AS leased
          FROM due JOIN known ON known.id = due.id
          WHERE due.limited
          GROUP BY due.endpoint) n
    WHERE b.endpoint = n.endpoint
)
UPDATE effects e SET
    state = CASE WHEN known.delivered_at IS NULL THEN 'leased' ELSE 'delivered' END,
    lease_owner = CASE WHEN known.delivered_at IS NULL THEN :worker_id END,
    lease_token = CASE WHEN known.delivered_at IS NULL THEN gen_random_uuid() END,
    lease_expires_at = CASE WHEN known.delivered_at IS NULL
                            THEN now() + make_interval(secs => :lease_s) END,
    next_attempt_at = CASE WHEN known.delivered_at IS NULL
                           THEN now() + make_interval(secs => :lease_s)
                           ELSE e.next_attempt_at END,
    attempt_count = e.attempt_count + CASE WHEN known.delivered_at IS NULL THEN 1 ELSE 0 END,
    delivered_at = COALESCE(known.delivered_at, e.delivered_at),
    last_error = CASE WHEN known.delivered_at IS NULL THEN e.last_error
                      WHEN known.in_ledger THEN 'already delivered (key ledger): not sent again'
                      ELSE 'already delivered (its delivered_at): not sent again' END,
    updated_at = now()
FROM known
WHERE e.id = known.id
RETURNING e.id, e.idempotency_key, e.endpoint, e.recipient, CAST(e.payload AS text) AS payload,
          e.attempt_count, CAST(e.lease_token AS text) AS lease_token,
          known.delivered_at IS NOT NULL AS already_delivered,
          -- the send-by time as seconds left on this clock (store.claim makes it a
          -- deadline on the worker's: no clock of two machines is compared)
          CAST(EXTRACT(EPOCH FROM e.expires_at - now()) AS float8) AS expires_in_s,
          known.capped;

-- name: trace_contexts
-- Tracing on only (the claim itself reads nothing more): the trace each claimed
-- effect was created in, enqueue's own or else its batch's, through its run.
SELECT e.id,
       COALESCE(e.trace_parent, b.trace_parent),
       CASE WHEN e.trace_parent IS NOT NULL THEN e.trace_state ELSE b.trace_state END
FROM effects e
LEFT JOIN batches b ON b.run_id = e.run_id
WHERE e.id = ANY(CAST(:ids AS bigint[]))
  AND (e.trace_parent IS NOT NULL OR b.trace_parent IS NOT NULL);

-- name: durable_commit
-- Outcomes and the key ledger are durable at COMMIT, even on a session that
-- commits claims asynchronously (store.ENGINE_OPTIONS).
SET LOCAL synchronous_commit = on;

-- name: record
-- Record a batch of attempt outcomes in one statement (an 'expired' outcome: the
-- send-by time passed before the first byte, nothing was sent): every row is fenced by
-- its lease token (a worker that lost its lease changes nothing on the effect;
-- its attempt is logged as 'stale'); a delivered effect's row keeps its key from
-- being sent again (the key ledger gets it when the row is deleted:
-- objects/ledger.sql); a 410 pauses the endpoint, audited (actor 'system') as an
-- operator's pause is, in the same statement, and so is the start of each rest.
-- An attempt of a resend carries its effect's resend_action_id (the operator's
-- action that asked for it).
-- The outcomes come as one JSON array of arrays (store.record): eleven typed
-- arrays cost the driver ~8 us a row to quote and the server as much to parse
-- (measured, every column read: 15.4-16.8 us a row round trip; as jsonb 3.6-3.7;
-- as json 8.9-9.3, each ->> parsing its element again).
WITH r AS (
    SELECT CAST(j->>0 AS bigint) AS id, CAST(j->>1 AS uuid) AS token, j->>2 AS outcome,
           CAST(j->>3 AS float8) AS delay_s, j->>4 AS error, CAST(j->>5 AS int) AS status_code,
           j->>6 AS error_class, j->>7 AS excerpt,
           to_timestamp(CAST(j->>8 AS float8)) AS started_at,
           CAST(j->>9 AS float8) AS duration_ms, CAST(j->>10 AS int) AS attempt,
           j->>11 AS trace_parent
    FROM jsonb_array_elements(CAST(:rows AS jsonb)) AS j
), updated AS (
    UPDATE effects e SET
        state = CASE r.outcome WHEN 'delivered' THEN 'delivered'
                               WHEN 'retry' THEN 'pending'
                               WHEN 'uncertain' THEN 'uncertain'
                               WHEN 'expired' THEN 'expired' ELSE 'dead' END,
        -- kept on an uncertain effect (when its send started), cleared otherwise
        send_started_at = CASE WHEN r.outcome = 'uncertain' THEN e.send_started_at END,
        next_attempt_at = CASE WHEN r.outcome = 'retry'
                               THEN now() + make_interval(secs => r.delay_s)
                               ELSE e.next_attempt_at END,
        delivered_at = CASE WHEN r.outcome = 'delivered' THEN now() ELSE e.delivered_at END,
        last_error = r.error,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
        updated_at = now()
    FROM r
    -- Fenced: still leased, by this token. The state is tested in a form no partial
    -- index's predicate can be proved from (a CASE), so each row is found by its id
    -- (pk_effects) whatever the statistics say: as `e.state = 'leased'` it matched
    -- ix_effects_due, and statistics taken while nearly everything was finished
    -- (the table analyzed with its history, then a backlog committed) priced that
    -- range at one row; every record then walked the whole due backlog to hash its
    -- leased rows, 1.2 s a record beside 1,000,000 due effects (bench dispatch
    -- --history; auto_explain). release and start_sends fence the same way.
    WHERE e.id = r.id AND CASE e.state WHEN 'leased' THEN true ELSE false END
      AND e.lease_token = r.token
    RETURNING e.id, r.token, e.endpoint, r.outcome, r.error, r.started_at, r.status_code,
              r.error_class
), paused AS (
    UPDATE endpoints p SET enabled = false, paused_reason = g.reason, paused_at = now(),
                           updated_at = now()
    FROM (SELECT endpoint, min(error) AS reason FROM updated WHERE outcome = 'gone'
          GROUP BY endpoint) g
    WHERE p.name = g.endpoint AND p.enabled
    RETURNING p.name, p.paused_reason
), paused_audited AS (
    INSERT INTO operator_actions (actor, action, target, reason, details)
    SELECT 'system', 'pause_endpoint', name, COALESCE(paused_reason, '410 Gone'),
           '{"cause": "410 Gone"}'
    FROM paused
), streak AS (
    -- What all dispatchers share (endpoint_budgets): a delivery ends the failing
    -- streak and the rest; a failure extends the streak, and from the Nth in a row
    -- the endpoint rests (base, doubling, at most the longest rest; settings.Breaker,
    -- by default the 5th, 1 s, 60 s): no dispatcher claims for it.
    -- (The doubling stops at 2^60: past any longest rest, never an overflow.)
    -- A healthy endpoint writes nothing here (the hot path), so a durable record
    -- never holds a budget row that claims need (they would skip the endpoint).
    -- resting_since is set only when a rest begins (none running): decided on the
    -- row this statement locked, so of concurrent records exactly one begins a rest.
    UPDATE endpoint_budgets b SET
        failures = CASE WHEN s.delivered > 0 THEN 0 ELSE b.failures + s.failed END,
        failing_since = CASE WHEN s.delivered > 0 THEN NULL
                             ELSE COALESCE(b.failing_since, s.first_failed_at) END,
        resting_until = CASE
            WHEN s.delivered > 0 THEN NULL
            WHEN b.failures + s.failed >= CAST(:breaker_failures AS int)
                THEN now() + make_interval(secs => LEAST(
                    CAST(:breaker_max_s AS float8),
                    CAST(:breaker_base_s AS float8)
                    * 2 ^ LEAST(b.failures + s.failed - CAST(:breaker_failures AS int), 60)))
            ELSE b.resting_until END,
        resting_since = CASE
            WHEN s.delivered > 0 THEN NULL
            WHEN b.failures + s.failed >= CAST(:breaker_failures AS int)
                 AND (b.resting_until IS NULL OR b.resting_until <= now()) THEN now()
            ELSE b.resting_since END,
        last_failure = CASE WHEN s.delivered > 0 THEN NULL
                            ELSE COALESCE(s.last_failure, b.last_failure) END
    -- (An effect that expired before its first byte says nothing of the endpoint.)
    FROM (SELECT u.endpoint,
                 count(*) FILTER (WHERE u.outcome = 'delivered') AS delivered,
                 count(*) FILTER (WHERE u.outcome <> 'delivered') AS failed,
                 min(u.started_at) FILTER (WHERE u.outcome <> 'delivered') AS first_failed_at,
                 -- our words for it, never the receiver's text (shown to support)
                 (array_agg(COALESCE('HTTP ' || u.status_code, u.error_class, u.outcome)
                            ORDER BY u.started_at DESC)
                  FILTER (WHERE u.outcome <> 'delivered'))[1] AS last_failure
          FROM updated u WHERE u.outcome <> 'expired' GROUP BY u.endpoint) s
    WHERE b.endpoint = s.endpoint AND (s.failed > 0 OR b.failures > 0)
    RETURNING b.endpoint, b.failures, b.failing_since, b.resting_until, b.resting_since,
              b.last_failure
), rested AS (
    -- One audit row per rest (actor 'system', as an operator's pause is), when it
    -- begins: never per attempt; at most one a minute for an endpoint that stays
    -- down (the longest rest, 60 s by default).
    INSERT INTO operator_actions (actor, action, target, reason, details)
    SELECT 'system', 'rest_endpoint', endpoint,
           'circuit breaker: ' || failures || ' failed attempts in a row since '
           || to_char(failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || COALESCE(' (the last: ' || last_failure || ')', '')
           || '; no dispatcher claims for it until '
           || to_char(resting_until AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
           jsonb_build_object('failures', failures, 'failing_since', failing_since,
                              'resting_until', resting_until, 'last_failure', last_failure)
    FROM streak
    WHERE resting_since = now()
), logged AS (
    INSERT INTO delivery_attempts (effect_id, attempt, worker_id, lease_token, started_at,
                                   duration_ms, outcome, status_code, error_class, error,
                                   response_excerpt, resend_action_id, trace_parent)
    SELECT r.id, r.attempt, :worker_id, r.token, r.started_at, r.duration_ms,
           -- a hashed lookup: a join on the CTE planned as a nested loop (O(n^2))
           CASE WHEN (r.id, r.token) IN (SELECT u.id, u.token FROM updated u)
                THEN r.outcome ELSE 'stale' END,
           r.status_code, r.error_class, r.error, r.excerpt,
           -- (the row as the lease saw it: this statement's snapshot; a stale
           -- attempt may predate the resend, so it is not marked)
           CASE WHEN (r.id, r.token) IN (SELECT u.id, u.token FROM updated u)
                THEN e.resend_action_id END,
           r.trace_parent
    FROM r
    JOIN effects e ON e.id = r.id
), counted AS MATERIALIZED (
    -- The leases that ended on an endpoint with max_in_flight (store.record then
    -- takes them off its count, see leases_ended): looked up per row below, so
    -- kept apart from the other updated rows; without such endpoints, empty (a
    -- lookup per row in all of updated cost ~1 ms per 130-row batch).
    SELECT u.id, u.token, u.endpoint FROM updated u
    JOIN endpoints ep ON ep.name = u.endpoint AND ep.max_in_flight IS NOT NULL
)
-- (tokens as text: the driver would parse every one into a uuid.UUID and back)
-- (and, for a lease that ended on an endpoint with max_in_flight, its endpoint)
SELECT r.id, CAST(r.token AS text), (r.id, r.token) IN (SELECT u.id, u.token FROM updated u),
       (SELECT c.endpoint FROM counted c WHERE c.id = r.id AND c.token = r.token)
FROM r;

-- name: leases_ended
-- Recorded leases leave their endpoint's max_in_flight count: right after the
-- record's durable commit, in a statement of its own that commits at once
-- (asynchronously), so the budget row a claim locks is held for microseconds,
-- never for a WAL flush. (A crash between the two leaves the count high by that
-- batch, holding the endpoint back, never letting it exceed its limit, until an
-- operator changes its limits or resumes it, which recounts.)
UPDATE endpoint_budgets b SET in_flight = GREATEST(0, b.in_flight - n.ended)
FROM unnest(CAST(:endpoints AS text[]), CAST(:ended AS int[])) AS n(endpoint, ended)
WHERE b.endpoint = n.endpoint;

-- name: release
-- Hand back leases of claimed-but-unsent effects (shutdown, a paused endpoint,
-- a resting one): due again after :delays_s, and the attempt that never
-- happened is not counted; the lease leaves its endpoint's max_in_flight count.
WITH released AS (
    UPDATE effects e SET state = 'pending',
                         next_attempt_at = now() + make_interval(secs => r.delay_s),
                         attempt_count = GREATEST(e.attempt_count - 1, 0),
                         send_started_at = NULL,
                         lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                         updated_at = now()
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]), CAST(:delays_s AS float8[]))
         AS r(id, token, delay_s)
    -- fenced as the record is, by id whatever the statistics say (its comment)
    WHERE e.id = r.id AND CASE e.state WHEN 'leased' THEN true ELSE false END
      AND e.lease_token = r.token
    RETURNING e.id, e.endpoint
), freed AS (
    UPDATE endpoint_budgets b SET in_flight = GREATEST(0, b.in_flight - n.ended)
    FROM (SELECT endpoint, count(*) AS ended FROM released GROUP BY endpoint) n
    JOIN endpoints ep ON ep.name = n.endpoint AND ep.max_in_flight IS NOT NULL
    WHERE b.endpoint = n.endpoint
)
SELECT id FROM released;

-- name: start_sends
-- "This send started", before any byte of it goes out, for effects of endpoints
-- that cannot deduplicate (docs/dispatcher.md, "Uncertain sends"): fenced by the
-- lease token, so a worker that lost a lease learns it here and does not send;
-- run under durable_commit, so the fact survives a crash of the machine too.
-- Returns the ids marked (the ones that may be sent).
UPDATE effects e SET send_started_at = now()
FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS r(id, token)
-- fenced as the record is, by id whatever the statistics say (its comment)
WHERE e.id = r.id AND CASE e.state WHEN 'leased' THEN true ELSE false END
  AND e.lease_token = r.token
RETURNING e.id;

-- name: settle_uncertain
-- An expired lease of a send that started (its dispatcher died or hung mid-send)
-- becomes 'uncertain': never claimed (claimable_effects leaves it out), never
-- retried; an operator decides. One range of ix_effects_send_started (rows are in
-- it only while such a send is in flight); rows a record holds are skipped (it
-- settles them). The attempt gets its row (outcome 'uncertain'), and the lease
-- leaves its endpoint's max_in_flight count as a recorded one does.
WITH expired AS (
    SELECT e.id, e.lease_owner, e.lease_token, e.attempt_count, e.send_started_at,
           e.resend_action_id,
           'the send started at ' || to_char(e.send_started_at AT TIME ZONE 'UTC',
                                             'YYYY-MM-DD"T"HH24:MI:SS"Z"')
           || ' and its lease expired with no outcome recorded (dispatcher '
           || COALESCE(e.lease_owner, '?') || ' stopped mid-send?): not sent again '
           || 'automatically; mark it delivered or send it again' AS reason
    FROM effects e
    WHERE e.state = 'leased' AND e.send_started_at IS NOT NULL
      AND e.lease_expires_at < now()
    FOR UPDATE SKIP LOCKED
), settled AS (
    UPDATE effects e SET state = 'uncertain', last_error = x.reason,
                         lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL,
                         updated_at = now()
    FROM expired x
    WHERE e.id = x.id
    RETURNING e.id, e.idempotency_key, e.endpoint
), logged AS (
    INSERT INTO delivery_attempts (effect_id, attempt, worker_id, lease_token, started_at,
                                   duration_ms, outcome, error_class, error, resend_action_id)
    SELECT x.id, x.attempt_count, COALESCE(x.lease_owner, '?'), x.lease_token,
           x.send_started_at, 1000 * EXTRACT(EPOCH FROM now() - x.send_started_at),
           'uncertain', 'LeaseExpired', x.reason, x.resend_action_id
    FROM expired x
), freed AS (
    UPDATE endpoint_budgets b SET in_flight = GREATEST(0, b.in_flight - n.ended)
    FROM (SELECT endpoint, count(*) AS ended FROM settled GROUP BY endpoint) n
    JOIN endpoints ep ON ep.name = n.endpoint AND ep.max_in_flight IS NOT NULL
    WHERE b.endpoint = n.endpoint
)
SELECT idempotency_key, endpoint FROM settled;

-- name: expire_due
-- Effects whose send-by time has passed end 'expired', with the reason (the claim
-- already leaves them out: ready_effects). The oldest send-by times first, from
-- ix_effects_expiring, at most :limit a pass, visible ones only (a run's rows
-- without a marker do not exist yet), SKIP LOCKED (a claim or a record holding
-- one decides first). A leased one only once its lease has run out with no send
-- started: a live lease is its worker's, whose check right before the first byte
-- decides; a started send's outcome is unknown (settle_uncertain makes it
-- 'uncertain'). An ordered endpoint's successor is woken by effects_unpark_on_finish,
-- so an expired head never blocks its key; an expired lease leaves its endpoint's
-- max_in_flight count as a released one does.
WITH due AS (
    SELECT e.id, e.state AS was
    FROM effects e
    WHERE e.expires_at <= now() AND e.state IN ('pending', 'leased')
      AND (e.state = 'pending' OR (e.lease_expires_at < now() AND e.send_started_at IS NULL))
      AND EXISTS (SELECT 1 FROM visible_effects v WHERE v.id = e.id)
    ORDER BY e.expires_at
    LIMIT :limit
    FOR UPDATE OF e SKIP LOCKED
), expired AS (
    UPDATE effects e SET
        state = 'expired',
        last_error = 'not sent: its send-by time '
            || to_char(e.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            || CASE
                WHEN e.expires_at <= e.created_at THEN ' had passed when it was enqueued'
                WHEN EXISTS (SELECT 1 FROM batches b
                             WHERE b.run_id = e.run_id AND b.hold_state = 'held')
                    THEN ' passed while its batch was held'
                WHEN EXISTS (SELECT 1 FROM endpoints p WHERE p.name = e.endpoint AND NOT p.enabled)
                    THEN ' passed while endpoint ' || e.endpoint || ' was paused'
                -- Claimed (the claim counted the attempt), its lease ran out, no send recorded.
                WHEN due.was = 'leased'
                    THEN ' passed while it was claimed for attempt ' || e.attempt_count
                         || ', before a send was recorded (the endpoint''s limits, slow answers'
                         || ' ahead of it, or its dispatcher stopped)'
                         || COALESCE(' (last: ' || left(e.last_error, 200) || ')', '')
                WHEN e.attempt_count > 0
                    THEN ' passed before a retry, after ' || e.attempt_count || ' attempt(s)'
                         || COALESCE(' (last: ' || left(e.last_error, 200) || ')', '')
                ELSE ' passed before its first attempt, '
                     || ceil(extract(epoch FROM e.expires_at - e.created_at))::bigint
                     || ' s after it was enqueued: no dispatcher claimed it in time (were'
                     || ' dispatchers running? a backlog or the endpoint''s limits ahead of it?)'
                END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, updated_at = now()
    FROM due
    WHERE e.id = due.id
    RETURNING e.idempotency_key, e.endpoint, due.was
), freed AS (
    UPDATE endpoint_budgets b SET in_flight = GREATEST(0, b.in_flight - n.ended)
    FROM (SELECT endpoint, count(*) AS ended FROM expired WHERE was = 'leased'
          GROUP BY endpoint) n
    JOIN endpoints ep ON ep.name = n.endpoint AND ep.max_in_flight IS NOT NULL
    WHERE b.endpoint = n.endpoint
)
SELECT idempotency_key, endpoint FROM expired;

-- name: park_blocked
-- An ordered endpoint's effects that wait behind two or more earlier unfinished
-- effects of their key leave the claim's range of ix_effects_due: parked at
-- 'infinity', as a held batch's are, until the one before finishes (the
-- effects_unpark_* triggers wake each parked effect's successor, migration 1104).
-- The next effect of a key (right behind its head) stays due: a claim looks at
-- most at :window rows of an ordered endpoint anyway (store.CLAIM_WINDOW). Only
-- the front :window due rows of each ordered endpoint are looked at: the rows a
-- claim walks first. And only keys that crowd that front (:crowded of its rows or
-- more) are parked: a key with a few rows there costs a claim a few rows of its
-- walk, while each parked effect costs two more rewrites of the wide row (parked,
-- woken): 1,000 keys of 30 effects drained at 0.53-0.83x an unordered endpoint
-- with every effect behind two parked, 0.96-1.11x with none (bench/RESULTS.md).
-- Never waits: the blocked effect and the earlier one it waits for are locked
-- SKIP LOCKED, the earlier one FOR SHARE, so it cannot finish (and find nothing
-- to wake) before this parking commits; an earlier effect being recorded right
-- now is skipped, and the effect stays due (a later pass parks it if need be).
-- Nothing is parked on a schema without the waking trigger (a dispatcher newer
-- than the database's migrations): a parked effect would wait there for ever.
-- Planned so that stale statistics cannot blow it up (taken while the queue was
-- empty, they once made the planner probe every due row before the LIMIT and
-- join the front by rescanning all due rows: 5-7 s a pass, and the recorder
-- waiting on its 30,000 FOR SHARE locks): the front is MATERIALIZED and probed
-- on its own rows (at most :window an endpoint), each blocked row is then locked
-- by its id behind an OFFSET 0 fence; the dispatcher's sessions keep sorts off
-- (store.ENGINE_OPTIONS), so the probe can only step back in ix_effects_ordering.
WITH front AS MATERIALIZED (
    SELECT f.id
    FROM endpoints o
    CROSS JOIN LATERAL (
        -- (how many of the window's rows each key holds: counted over the window
        -- only, after its LIMIT)
        SELECT w.*, count(*) OVER (PARTITION BY w.ordering_key) AS crowd
        FROM (SELECT e.id, e.endpoint, e.ordering_key, e.created_at, e.state FROM effects e
              WHERE e.endpoint = o.name AND e.state IN ('pending', 'leased')
                AND e.next_attempt_at <= now()
              ORDER BY e.next_attempt_at
              LIMIT :window) w
    ) f
    WHERE o.ordered AND f.ordering_key IS NOT NULL AND f.state = 'pending'
      AND f.crowd >= :crowded
      AND EXISTS (SELECT 1 FROM pg_trigger t
                  WHERE t.tgrelid = 'effects'::regclass
                    AND t.tgname = 'effects_unpark_on_finish')
      AND EXISTS (
          -- the nearest earlier one first: one step back in ix_effects_ordering
          -- (kept as written: a locking EXISTS is not simplified); locked, so that
          -- it cannot finish (and find nothing parked to wake) before this commits
          SELECT 1 FROM (
              SELECT p.created_at, p.id FROM effects p
              WHERE p.endpoint = f.endpoint AND p.ordering_key = f.ordering_key
                AND p.state IN ('pending', 'leased')
                AND (p.created_at, p.id) < (f.created_at, f.id)
              ORDER BY p.created_at DESC, p.id DESC
              LIMIT 1
              FOR SHARE OF p SKIP LOCKED) q
          -- ... and it waits itself, behind one more: the next of a key whose head is
          -- being sent or due is left due (it is claimable the moment the head
          -- finishes; parking then waking it cost two more rewrites of the wide row
          -- per delivery on an ordered endpoint)
          -- (one more step back, as claimable_effects' probe is written: an EXISTS
          -- here was planned, on stale statistics, as a walk of ix_effects_due)
          WHERE (SELECT 1 FROM effects r
                 WHERE r.endpoint = f.endpoint AND r.ordering_key = f.ordering_key
                   AND r.state IN ('pending', 'leased')
                   AND (r.created_at, r.id) < (q.created_at, q.id)
                 ORDER BY r.created_at DESC, r.id DESC
                 LIMIT 1) IS NOT NULL)
), blocked AS (
    -- Locked by id alone (a state condition here would let the planner take
    -- ix_effects_due for it); the locked row's current state is checked after.
    -- The ids come as one array, so the whole front is probed before the first
    -- row is parked: probed while this UPDATE ran, each probe stepped back over
    -- every row of its key the pass had just parked (SKIP LOCKED skips rows this
    -- very statement changed), O(window^2) on a deep key: 1.3-2.1 s a pass
    -- behind 20,000 effects of one key, ~1,000 index rows a probe.
    SELECT b.id
    FROM unnest(ARRAY(SELECT id FROM front)) AS f(id)
    CROSS JOIN LATERAL (
        SELECT e.id, e.state, e.next_attempt_at FROM effects e
        WHERE e.id = f.id
        OFFSET 0
        FOR UPDATE OF e SKIP LOCKED
    ) b
    WHERE b.state = 'pending' AND b.next_attempt_at <= now()
)
UPDATE effects e SET next_attempt_at = 'infinity'
FROM blocked
WHERE e.id = blocked.id;

-- name: due_soon
-- For --until-idle: is anything claimable due now, or within :within_s?
SELECT EXISTS (
    SELECT 1 FROM claimable_effects e
    WHERE e.next_attempt_at <= now() + make_interval(secs => :within_s)
);

-- name: heartbeat
-- Tell operators (and the API's "live workers") this worker is alive and busy.
INSERT INTO worker_heartbeats (worker_id, hostname, pid, in_flight, delivered, failed)
VALUES (:worker_id, :hostname, :pid, :in_flight, :delivered, :failed)
ON CONFLICT (worker_id) DO UPDATE SET
    last_seen_at = now(), in_flight = EXCLUDED.in_flight,
    delivered = EXCLUDED.delivered, failed = EXCLUDED.failed, stopped_at = NULL;

-- name: heartbeat_stopped
-- A clean exit says so, so the worker is not mistaken for a crashed one.
UPDATE worker_heartbeats SET stopped_at = now(), last_seen_at = now(), in_flight = 0
WHERE worker_id = :worker_id;

-- name: auto_disable
-- An endpoint failing continuously (no delivery since the first failure of its
-- current streak, which began :after_s or more ago, and at least :min_failures
-- failed attempts) is paused by the system, with the reason, in the same
-- statement as its operator_actions row (actor 'system'). Run by every
-- dispatcher; "AND ep.enabled" lets exactly one of them do it.
WITH disabled AS (
    UPDATE endpoints ep SET
        enabled = false,
        paused_reason = 'disabled automatically: failing continuously since '
            || to_char(b.failing_since AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
            || ' (' || b.failures || ' failed attempts, no delivery since)',
        paused_at = now(), updated_at = now()
    FROM endpoint_budgets b
    WHERE b.endpoint = ep.name AND ep.enabled
      AND b.failing_since <= now() - make_interval(secs => :after_s)
      AND b.failures >= :min_failures
    RETURNING ep.name, ep.paused_reason, b.failing_since, b.failures
)
INSERT INTO operator_actions (actor, action, target, reason, details)
SELECT 'system', 'disable_endpoint', name, paused_reason,
       jsonb_build_object('failing_since', failing_since, 'failures', failures,
                          'after_s', CAST(:after_s AS float8))
FROM disabled
RETURNING target, reason;

-- name: session_settings
-- At start, without connection options (behind PgBouncer): what the role gives us.
SELECT name, setting FROM pg_settings WHERE name = ANY(:names);
