-- The commit's statements for result rows the results table refused
-- (spark_outbox.spark.result_rejects): run only after the batch's merge failed.

-- name: reject_null_results
-- Every staged row with a null in one NOT NULL column, in one pass: moved to
-- rejects with the reason naming the column (nulls are the common bad row, and a
-- job bug can make thousands; one statement per column, not a bisection each).
WITH refused AS (
    DELETE FROM staged_results s
    WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids) AND s.row ->> :column IS NULL
    RETURNING s.run_id, s.row
)
INSERT INTO rejects (job, batch_id, run_id, reason, raw_row)
SELECT :job, :batch_id, r.run_id, :reason, r.row FROM refused r;

-- name: repeated_conflict_key
-- One conflict key that two staged rows share (a merge cannot apply both), if any.
SELECT k.key::text FROM (
    SELECT (SELECT jsonb_agg(s.row -> u.name ORDER BY u.n)
            FROM unnest(CAST(:keys AS text[])) WITH ORDINALITY AS u(name, n)) AS key
    FROM staged_results s
    WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
) k
GROUP BY k.key HAVING count(*) > 1
LIMIT 1;

-- name: staged_slice_bounds
-- A task's staged rows in physical order: the merge retries slices of them by ctid.
SELECT s.ctid::text FROM staged_results s
WHERE s.run_id = :run_id AND s.task_id = :task_id
ORDER BY s.ctid;

-- name: staged_row
SELECT s.row::text FROM staged_results s
WHERE s.run_id = :run_id AND s.task_id = :task_id AND s.ctid = CAST(:ctid AS tid);

-- name: insert_reject
INSERT INTO rejects (job, batch_id, run_id, reason, raw_row)
VALUES (:job, :batch_id, :run_id, :reason, CAST(:raw_row AS jsonb));

-- name: constraint_columns
-- What a refused row broke: the constraint's columns and its definition, for the reason.
SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}'), pg_get_constraintdef(c.oid)
FROM pg_constraint c
LEFT JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
WHERE c.conrelid = to_regclass(:table) AND c.conname = :name
GROUP BY c.oid;

-- name: index_columns
-- A unique index that is not a constraint (CREATE UNIQUE INDEX): its columns.
SELECT coalesce(array_agg(a.attname ORDER BY a.attnum), '{}'), pg_get_indexdef(i.indexrelid)
FROM pg_index i
LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = to_regclass(:table) AND i.indexrelid = to_regclass(:name)
GROUP BY i.indexrelid;

-- name: populate_column_template
-- Which column of a refused row the table cannot take: that value alone, typed as
-- the column ({table} is quoted by the driver after a catalog check).
SELECT jsonb_populate_record(NULL::{table}, jsonb_build_object(:column, CAST(:raw_row AS jsonb) -> :column));
