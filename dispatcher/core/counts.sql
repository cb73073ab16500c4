-- name: by_endpoint_and_state
-- The visible effects per (endpoint, state): the sum of effect_counts, whose rows
-- the triggers of objects/counts.sql add and fold() keeps few. A run's rows count
-- once its marker exists (visible_effects' rule, probed per run still unfolded).
SELECT c.endpoint, c.state, sum(c.n) AS n
FROM effect_counts c
WHERE c.run_id IS NULL OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = c.run_id)
GROUP BY c.endpoint, c.state
HAVING sum(c.n) <> 0;

-- name: fold
-- The rows written since the last fold become one row per (endpoint, state, run),
-- a committed run's folded into the visible ones (run_id NULL). Rows another fold
-- holds are skipped (several dispatchers fold at once, nothing waits), and rows
-- the writers add meanwhile wait for the next fold. Returns the rows folded.
-- The rows locked are deleted by their addresses (a TID scan, linear whatever the
-- statistics say): as `id IN (SELECT id ...)`, statistics taken while the table held
-- ~10 rows planned a nested loop over a materialized copy, quadratic in the rows
-- written since (5,000 rows: 12.5M comparisons, 1.1-1.5 s a fold, every
-- heartbeat, in each dispatcher process: auto_explain, bench dispatch --history).
WITH taken AS (
    DELETE FROM effect_counts c
    WHERE c.ctid = ANY (ARRAY(SELECT ctid FROM effect_counts FOR UPDATE SKIP LOCKED))
    RETURNING c.endpoint, c.state, c.run_id, c.n
), folded AS (
    INSERT INTO effect_counts (endpoint, state, run_id, n)
    SELECT t.endpoint, t.state, v.run_id, sum(t.n)
    FROM taken t
    CROSS JOIN LATERAL (
        SELECT CASE WHEN t.run_id IS NULL
                      OR EXISTS (SELECT 1 FROM batches b WHERE b.run_id = t.run_id)
                    THEN NULL ELSE t.run_id END AS run_id
    ) v
    GROUP BY t.endpoint, t.state, v.run_id
    HAVING sum(t.n) <> 0
)
SELECT count(*) FROM taken;

-- name: fold_attempts
-- As fold, for attempt_counts: one row per (minute, outcome), and minutes older
-- than the chart's longest range (:keep_hours) dropped. Deleted by address, as fold.
WITH taken AS (
    DELETE FROM attempt_counts c
    WHERE c.ctid = ANY (ARRAY(SELECT ctid FROM attempt_counts FOR UPDATE SKIP LOCKED))
    RETURNING c.minute, c.outcome, c.n
), folded AS (
    INSERT INTO attempt_counts (minute, outcome, n)
    SELECT t.minute, t.outcome, sum(t.n)
    FROM taken t
    WHERE t.minute >= date_trunc('minute', now()) - make_interval(hours => :keep_hours)
    GROUP BY t.minute, t.outcome
    HAVING sum(t.n) <> 0
)
SELECT count(*) FROM taken;
