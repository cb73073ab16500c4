-- The invariants `outbox verify` checks (dispatcher/console/verify.py). Each query
-- returns the offending rows (at most :limit) with a one-line detail; none should
-- ever return one. Two kinds: "state" checks read what is true now (small partial
-- indexes: leases, held batches, runs in flight); "range" checks read rows past a
-- watermark the checker keeps, a chunk a pass, so a long history is read once and
-- each later pass reads only what changed.

-- name: max_effect_id
SELECT COALESCE(max(id), 0) AS id FROM effects;

-- name: max_batch_id
SELECT COALESCE(max(id), 0) AS id FROM batches;

-- name: effect_without_marker
-- Range (effects by id): a Spark effect row whose run neither committed (a marker
-- in batches) nor is in flight or being swept (batch_runs): a row the sweep should
-- have deleted, or that a commit left behind. An effect with a job but no run
-- (written before run ids existed) needs the marker of its batch.
SELECT e.id, e.idempotency_key AS key,
       'job ' || e.job || ' batch ' || e.batch_id || ': no marker and no run in flight' AS detail
FROM effects e
WHERE e.id > :lo AND e.id <= :hi AND e.job IS NOT NULL
  AND CASE WHEN e.run_id IS NULL
           THEN NOT EXISTS (SELECT 1 FROM batches b
                            WHERE b.job = e.job AND b.batch_id = e.batch_id)
           ELSE NOT EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
                AND NOT EXISTS (SELECT 1 FROM batch_runs r WHERE r.run_id = e.run_id)
      END
ORDER BY e.id
LIMIT :limit;

-- name: sent_before_commit
-- State: an effect of a run with no marker yet (in flight, or swept) that a
-- dispatcher touched. Invisible rows are never claimed; one that was, was sent
-- before its batch committed (or without it ever committing).
SELECT e.id, e.idempotency_key AS key,
       'state ' || e.state || ', ' || e.attempt_count || ' attempt(s) while run '
       || e.run_id || ' of job ' || e.job || ' batch ' || e.batch_id || ' has no marker' AS detail
FROM batch_runs r
JOIN effects e ON e.job = r.job AND e.batch_id = r.batch_id AND e.run_id = r.run_id
WHERE NOT EXISTS (SELECT 1 FROM batches b WHERE b.run_id = r.run_id)
  AND (e.state <> 'pending' OR e.attempt_count > 0)
ORDER BY e.id
LIMIT :limit;

-- name: finished_without_attempts
-- Range (rows finished since the watermark, through ix_effects_purgeable): a
-- delivered or dead effect the dispatcher tried (attempt_count > 0; a key the
-- ledger already knew is settled with none) must keep its attempts until purged,
-- and a delivered one its delivered attempt.
SELECT e.id, e.idempotency_key AS key,
       e.state || ' after ' || e.attempt_count || ' attempt(s), but '
       || CASE WHEN e.state = 'delivered' THEN 'no delivered attempt is logged'
               ELSE 'no attempt is logged' END AS detail
FROM effects e
WHERE e.purged_at IS NULL AND e.state IN ('delivered', 'dead', 'cancelled')
  AND (e.updated_at, e.id) > (:lo_at, :lo_id) AND (e.updated_at, e.id) <= (:hi_at, :hi_id)
  AND e.state <> 'cancelled' AND e.attempt_count > 0
  AND NOT EXISTS (SELECT 1 FROM delivery_attempts a
                  WHERE a.effect_id = e.id
                    AND (e.state <> 'delivered' OR a.outcome = 'delivered'))
ORDER BY e.updated_at, e.id
LIMIT :limit;

-- name: ledger_guard_off
-- State: a finished effect's key enters the key ledger when its row is deleted, by
-- the trigger on DELETE of effects (objects/ledger.sql); without it (dropped, or
-- disabled by ALTER TABLE ... DISABLE TRIGGER) the next purge forgets the keys it
-- deletes, and a replay could enqueue and send them again. One row when it is
-- missing or disabled (a catalog read: cheap at any size).
SELECT 0 AS id, CAST(NULL AS text) AS key,
       CASE WHEN t.tgenabled IS NULL THEN 'the trigger effects_keys_kept_on_delete is missing'
            ELSE 'the trigger effects_keys_kept_on_delete is disabled' END
       || ': a purge would forget the keys it deletes; run `outbox db upgrade`'
       || ' (or ALTER TABLE effects ENABLE TRIGGER effects_keys_kept_on_delete)' AS detail
FROM (SELECT NULL) one
LEFT JOIN pg_trigger t ON t.tgrelid = CAST('effects' AS regclass)
                      AND t.tgname = 'effects_keys_kept_on_delete'
WHERE t.tgenabled IS NULL OR t.tgenabled = 'D'
LIMIT :limit;

-- name: delivered_again_unasked
-- Range, the same rows: a delivered key goes out again only when an operator
-- resends it. A delivered attempt after an earlier delivered one must carry its
-- resend's action (the record copies effects.resend_action_id); one without is a
-- second send on our own account. (A lost lease's late record is 'stale', never
-- 'delivered'.)
SELECT e.id, e.idempotency_key AS key,
       'delivered again at attempt ' || a.attempt || ' without an operator''s resend' AS detail
FROM effects e
JOIN LATERAL (
    SELECT a.attempt FROM delivery_attempts a
    WHERE a.effect_id = e.id AND a.outcome = 'delivered' AND a.resend_action_id IS NULL
      AND EXISTS (SELECT 1 FROM delivery_attempts b
                  WHERE b.effect_id = e.id AND b.outcome = 'delivered'
                    AND (b.attempt, b.id) < (a.attempt, a.id))
    ORDER BY a.attempt
    LIMIT 1
) a ON true
WHERE e.purged_at IS NULL AND e.state IN ('delivered', 'dead', 'cancelled')
  AND (e.updated_at, e.id) > (:lo_at, :lo_id) AND (e.updated_at, e.id) <= (:hi_at, :hi_id)
  AND e.attempt_count > 1
ORDER BY e.updated_at, e.id
LIMIT :limit;

-- name: sent_after_expiry
-- Range, the same rows: a send that started at or after the effect's send-by time
-- (an attempt other than 'expired', which stopped before its first byte; 'stale'
-- ones count: they were sent). Attempt times are the worker's clock and send-by
-- times the database's: the two must agree (NTP), as they must for leases.
SELECT e.id, e.idempotency_key AS key,
       'attempt ' || a.attempt || ' (' || a.outcome || ') started '
       || to_char(a.started_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
       || ', at or after its send-by time '
       || to_char(e.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS detail
FROM effects e
CROSS JOIN LATERAL (
    SELECT x.attempt, x.outcome, x.started_at FROM delivery_attempts x
    WHERE x.effect_id = e.id AND x.outcome <> 'expired' AND x.started_at >= e.expires_at
    ORDER BY x.attempt
    LIMIT 1
) a
WHERE e.purged_at IS NULL AND e.state IN ('delivered', 'dead', 'cancelled')
  AND (e.updated_at, e.id) > (:lo_at, :lo_id) AND (e.updated_at, e.id) <= (:hi_at, :hi_id)
  AND e.expires_at IS NOT NULL
ORDER BY e.updated_at, e.id
LIMIT :limit;

-- name: expiry_overdue
-- State: a pending effect past its send-by time by more than the grace. The claim
-- never takes it; the dispatcher's expiry pass moves it to 'expired' within a poll
-- interval. One that stays means no dispatcher runs the pass (an ordered key
-- behind it waits meanwhile). ix_effects_expiring.
SELECT e.id, e.idempotency_key AS key,
       'pending, send-by time '
       || to_char(e.expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
       || ' (endpoint ' || e.endpoint || ')' AS detail
FROM effects e
WHERE e.expires_at < now() - make_interval(secs => :grace_s)
  AND e.state = 'pending'
  AND EXISTS (SELECT 1 FROM visible_effects v WHERE v.id = e.id)
ORDER BY e.expires_at
LIMIT :limit;

-- name: finished_chunk_end
-- Where this pass of the three checks above ends: the :chunk-th finished row past
-- the watermark (or the last one before :settled_at, rows that finished long
-- enough ago for their transaction to have committed).
SELECT s.updated_at AS at, s.id
FROM (SELECT e.updated_at, e.id
      FROM effects e
      WHERE e.purged_at IS NULL AND e.state IN ('delivered', 'dead', 'cancelled')
        AND (e.updated_at, e.id) > (:lo_at, :lo_id) AND e.updated_at <= :settled_at
      ORDER BY e.updated_at, e.id
      LIMIT :chunk) s
ORDER BY s.updated_at DESC, s.id DESC
LIMIT 1;

-- name: lease_overdue
-- State: a lease past its expiry by more than the grace. An expired lease is due
-- again (the claim takes it back, or settles it uncertain when its send had
-- started); one that stays is an effect no dispatcher is looking after.
SELECT e.id, e.idempotency_key AS key,
       'leased by ' || COALESCE(e.lease_owner, '?') || ', lease expired '
       || to_char(e.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
       || ' (endpoint ' || e.endpoint || ')' AS detail
FROM effects e
WHERE e.state = 'leased' AND e.lease_expires_at < now() - make_interval(secs => :grace_s)
ORDER BY e.lease_expires_at
LIMIT :limit;

-- name: held_batch_leased
-- State: the volume guard's held batches wait for an operator; none of their
-- effects may be leased (claimable_effects excludes them).
SELECT e.id, e.idempotency_key AS key,
       'leased while job ' || b.job || ' batch ' || b.batch_id || ' is held' AS detail
FROM batches b
JOIN effects e ON e.job = b.job AND e.batch_id = b.batch_id
                AND (e.run_id = b.run_id OR e.run_id IS NULL)
WHERE b.hold_state = 'held' AND e.state = 'leased'
ORDER BY e.id
LIMIT :limit;

-- name: marker_counts
-- Range (markers by id): a marker's counts equal the rows they count: its new
-- effects are the effect rows its run wrote and those retention deleted since
-- (effects_purged; an older release's purge kept stubs, which are rows), its
-- rejects the rejects of its run (rows written before run ids existed have none:
-- they count for their batch).
SELECT b.id, NULL AS key,
       'job ' || b.job || ' batch ' || b.batch_id || ': marker counts ' || b.effects_new
       || ' new effect(s) and ' || b.rejects || ' reject(s); the tables hold '
       || e.n || ' (and retention deleted ' || b.effects_purged || ') and ' || j.n AS detail
FROM batches b
CROSS JOIN LATERAL (SELECT count(*) AS n FROM effects x
                    WHERE x.job = b.job AND x.batch_id = b.batch_id
                      AND (x.run_id = b.run_id OR x.run_id IS NULL)) e
CROSS JOIN LATERAL (SELECT count(*) AS n FROM rejects r
                    WHERE r.job = b.job AND r.batch_id = b.batch_id
                      AND (r.run_id = b.run_id OR r.run_id IS NULL)) j
WHERE b.id > :lo AND b.id <= :hi
  AND (e.n + b.effects_purged <> b.effects_new OR j.n <> b.rejects)
ORDER BY b.id
LIMIT :limit;

-- name: now
SELECT now();

-- name: finished_count
-- How many finished rows the window of this pass held (ix_effects_purgeable).
SELECT count(*) FROM effects e
WHERE e.purged_at IS NULL AND e.state IN ('delivered', 'dead', 'cancelled')
  AND (e.updated_at, e.id) > (:lo_at, :lo_id) AND (e.updated_at, e.id) <= (:hi_at, :hi_id);
