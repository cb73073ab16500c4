-- Reconciliation of a batch's result rows (dispatcher/console/results.py): what the
-- batch recorded writing (batch_result_rows) against what its results table holds
-- now. The {placeholders} are the table's identifiers, checked against the catalog
-- and quoted (spark_outbox.core.resultrows), as the sink's merge fills its template.

-- name: recorded_count
SELECT count(*) FROM batch_result_rows WHERE batch_ref = :batch_ref;

-- name: compare_chunk_template
-- One chunk of the batch's recorded rows in key order (its primary key), each
-- looked up in the results table by its conflict key (the table's unique index):
-- gone, holding what the batch wrote (the digest, under pinned settings), or
-- holding something else, then explained only by a later batch of the same
-- table that wrote the key: one probe of pk_batch_result_rows per later batch
-- (batches holds one row per batch), asked of a changed row only.
SELECT w.key,
       CASE WHEN t.{first_key} IS NULL THEN 'missing'
            WHEN {digest} = w.row_sha256 THEN 'as_written'
            WHEN EXISTS (SELECT 1 FROM batches lb
                         JOIN batch_result_rows l ON l.batch_ref = lb.id AND l.key = w.key
                         WHERE lb.id > w.batch_ref AND lb.results_table = :results_table)
            THEN 'overwritten'
            ELSE 'changed' END AS category
FROM batch_result_rows w
CROSS JOIN LATERAL jsonb_populate_record(NULL::{table}, w.key) k
LEFT JOIN {table} t ON ({t_keys}) = ({k_keys})
WHERE w.batch_ref = :batch_ref
  AND (CAST(:after AS jsonb) IS NULL OR w.key > CAST(:after AS jsonb))
ORDER BY w.key
LIMIT :chunk;

-- name: foreign_chunk_template
-- Rows of the results table stamped with this batch (its job and batch id columns)
-- that the batch did not record writing, in key order after :after: each chunk
-- reads on through the batch's rows until it has :chunk foreign ones.
SELECT {key} AS key
FROM {table} t
WHERE t.{job_column} = :job AND t.{batch_column} = :batch_id
  AND (CAST(:after AS jsonb) IS NULL
       OR ({t_keys}) > (SELECT {a_keys}
                        FROM jsonb_populate_record(NULL::{table}, CAST(:after AS jsonb)) a))
  AND NOT EXISTS (SELECT 1 FROM batch_result_rows w
                  WHERE w.batch_ref = :batch_ref AND w.key = {key})
ORDER BY {t_keys}
LIMIT :chunk;
