-- Erasure (spark_outbox.console.erasure): one person's data out of the outbox.
-- A person is selected by exactly one of :recipient, :reference or :path with
-- :value (a payload field); the others are NULL, folded away at planning (the
-- driver sends values inline), so by recipient or reference the effects' partial
-- indexes serve; by a payload field the table is scanned, one id range a batch.

-- name: matching_effects
-- The dry run's list: the person's effects, whatever their state, with what the
-- erasure would do to each (at most :limit listed, from :after_id on).
SELECT e.id, e.idempotency_key, e.endpoint, e.state, e.created_at,
       CASE WHEN e.state = 'leased' THEN 'in_flight'
            WHEN e.run_id IS NOT NULL
                 AND NOT EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id)
                THEN 'in_flight'
            WHEN e.state IN ('pending', 'uncertain') THEN 'cancel'
            ELSE 'erase' END AS plan
FROM effects e
WHERE (CAST(:recipient AS text) IS NULL OR e.recipient = :recipient)
  AND (CAST(:reference AS text) IS NULL OR e.reference = :reference)
  AND (CAST(:path AS text[]) IS NULL OR e.payload #>> CAST(:path AS text[]) = :value)
  AND e.id > :after_id
ORDER BY e.id
LIMIT :limit;

-- name: count_attempts
-- The dry run: attempts of the person's effects whose outside text (the
-- receiver's excerpt, the error) would be blanked; :ids from matching_effects.
SELECT count(*) FROM delivery_attempts
WHERE effect_id = ANY(CAST(:ids AS bigint[]))
  AND (error IS NOT NULL OR response_excerpt IS NOT NULL);

-- name: erase_effects
-- One batch, one short transaction: the person's next :batch_size effects that
-- are neither being sent (leased: fenced by their lease token, left for a later
-- erase) nor written by a run that has not committed, locked. Their attempts
-- lose the outside text; the effect loses payload, recipient, reference,
-- ordering key and error, and if unsent (pending, held, uncertain) is cancelled;
-- its key goes to the ledger with its final state, so it is never enqueued or
-- sent again. Keys, states, times, counts and hashes stay.
WITH doomed AS (
    SELECT e.id, e.state AS was, e.updated_at AS finished_at
    FROM effects e
    WHERE (CAST(:recipient AS text) IS NULL OR e.recipient = :recipient)
      AND (CAST(:reference AS text) IS NULL OR e.reference = :reference)
      AND (CAST(:path AS text[]) IS NULL OR e.payload #>> CAST(:path AS text[]) = :value)
      AND e.id > :after_id
      AND e.state <> 'leased'
      AND (e.run_id IS NULL OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = e.run_id))
    ORDER BY e.id
    LIMIT :batch_size
    FOR UPDATE OF e
), attempts AS (
    UPDATE delivery_attempts a SET error = NULL, response_excerpt = NULL
    FROM doomed d
    WHERE a.effect_id = d.id AND (a.error IS NOT NULL OR a.response_excerpt IS NOT NULL)
    RETURNING 1
), erased AS (
    UPDATE effects e SET
        payload = '{}'::jsonb, recipient = NULL, reference = NULL, ordering_key = NULL,
        last_error = :note,
        state = CASE WHEN d.was IN ('pending', 'uncertain') THEN 'cancelled' ELSE e.state END,
        lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL, send_started_at = NULL,
        purged_at = COALESCE(e.purged_at, now()), updated_at = now()
    FROM doomed d
    WHERE e.id = d.id
    RETURNING e.id, e.idempotency_key, e.endpoint, e.payload_sha256, e.state, e.delivered_at,
              d.was, CASE WHEN d.was IN ('pending', 'uncertain') THEN now()
                          ELSE d.finished_at END AS finished_at
), ledger AS (
    INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, state, finished_at,
                            delivered_at)
    SELECT idempotency_key, endpoint, payload_sha256, state, finished_at,
           CASE WHEN state = 'delivered' THEN COALESCE(delivered_at, finished_at) END
    FROM erased
    ON CONFLICT (idempotency_key) DO NOTHING
)
SELECT (SELECT count(*) FROM erased) AS effects,
       (SELECT count(*) FROM erased WHERE state = 'cancelled' AND was <> 'cancelled')
           AS cancelled,
       (SELECT count(*) FROM attempts) AS attempts,
       (SELECT max(id) FROM doomed) AS last_id;

-- name: matching_rejects
-- The person's rejects from :after_id on, at most :limit, oldest first. A raw row
-- is the job's, of no fixed shape: by recipient or reference, any value in it
-- equal to the one given (or, in a payload that is not JSON, the value quoted);
-- by a payload field, the path at the top of the row or in its payload.
SELECT r.id
FROM rejects r
WHERE r.id > :after_id
  AND CASE WHEN CAST(:path AS text[]) IS NULL THEN
          jsonb_path_exists(r.raw_row, 'strict $.** ? (@ == $v)',
                            jsonb_build_object('v', COALESCE(:recipient, :reference)))
          OR (jsonb_typeof(r.raw_row -> 'payload') = 'string'
              AND strpos(r.raw_row ->> 'payload',
                         CAST(to_jsonb(COALESCE(:recipient, :reference)) AS text)) > 0)
      ELSE r.raw_row #>> CAST(:path AS text[]) = :value
          OR r.raw_row -> 'payload' #>> CAST(:path AS text[]) = :value
      END
ORDER BY r.id
LIMIT :limit;

-- name: erase_rejects
-- One batch of the person's rejects (ids from matching_rejects; this locks them):
-- the raw row and the reason (which may quote a value) go; the row, its batch and
-- its time stay, so the batch's reject count still adds up. A blanked reject is
-- no longer requeueable (its reason lost the unknown-endpoint prefix).
UPDATE rejects SET raw_row = '{}'::jsonb, reason = :note
WHERE id = ANY(CAST(:ids AS bigint[]));

-- name: quoting_actions
-- Audit rows that may quote the person (the value anywhere in target, reason or
-- details, case-insensitively; the caller decides word by word), from :after_id on.
SELECT id, target, reason, details
FROM operator_actions
WHERE id > :after_id
  AND (strpos(lower(target), lower(:needle)) > 0
       OR strpos(lower(reason), lower(:needle)) > 0
       OR strpos(lower(CAST(details AS text)), lower(:escaped)) > 0)
ORDER BY id
LIMIT :limit;

-- name: allow_redaction
-- The audit trail's trigger lets this transaction blank quotes, for erasure :id only.
SELECT set_config('outbox.erasure', CAST(:id AS text), true);

-- name: redact_action
UPDATE operator_actions SET target = :target, reason = :reason,
                            details = CAST(:details AS jsonb)
WHERE id = :id;

-- name: path_known
-- Is the payload field anywhere (an effect's payload, a reject's row or payload)?
-- Asked only when it matched nothing: a misspelt path must not look like "done".
SELECT EXISTS (SELECT 1 FROM effects WHERE payload #> CAST(:path AS text[]) IS NOT NULL)
    OR EXISTS (SELECT 1 FROM rejects
               WHERE raw_row #> CAST(:path AS text[]) IS NOT NULL
                  OR raw_row -> 'payload' #> CAST(:path AS text[]) IS NOT NULL);

-- name: staged_matches
-- The person in the staging of Spark runs in flight (effects met already written
-- by another run, result rows, rejects): left to the run, which commits or is
-- swept within minutes, and counted as in flight (erase again afterwards). Erasing
-- them under a run would change what it commits; the tables are small.
SELECT (SELECT count(*) FROM deferred_effects d
        WHERE (CAST(:recipient AS text) IS NULL OR d.recipient = :recipient)
          AND (CAST(:reference AS text) IS NULL OR d.reference = :reference)
          AND (CAST(:path AS text[]) IS NULL
               OR d.payload #>> CAST(:path AS text[]) = :value))
     + (SELECT count(*) FROM staged_rejects r
        WHERE CASE WHEN CAST(:path AS text[]) IS NULL THEN
                  jsonb_path_exists(r.raw_row, 'strict $.** ? (@ == $v)',
                                    jsonb_build_object('v', COALESCE(:recipient, :reference)))
              ELSE r.raw_row #>> CAST(:path AS text[]) = :value
                  OR r.raw_row -> 'payload' #>> CAST(:path AS text[]) = :value
              END)
     + (SELECT count(*) FROM staged_results s
        WHERE CASE WHEN CAST(:path AS text[]) IS NULL THEN
                  jsonb_path_exists(s.row, 'strict $.** ? (@ == $v)',
                                    jsonb_build_object('v', COALESCE(:recipient, :reference)))
              ELSE s.row #>> CAST(:path AS text[]) = :value
              END);
