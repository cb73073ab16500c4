-- What a task of a stream written with format("outbox") asks before it writes: the
-- stream's batches get no driver-side step of ours before their tasks run, so each
-- task checks the marker and registers the (shared, derived) run itself.

-- name: read_marker
-- The replay check: a committed batch is not written again.
SELECT run_id FROM batches WHERE job = %(job)s AND batch_id = %(batch_id)s;

-- name: begin_run
-- The first task of a run registers it, the others find it; a swept run stays swept
-- (its commit is then refused, and the stream's restart runs the batch afresh).
INSERT INTO batch_runs (run_id, job, batch_id) VALUES (%(run_id)s, %(job)s, %(batch_id)s)
ON CONFLICT (run_id) DO NOTHING;

-- name: endpoint_kinds
-- As the driver's (commit.sql): unknown endpoints are rejects, e-mail ones checked.
SELECT name, CASE WHEN archived_at IS NULL THEN kind ELSE 'archived' END AS kind
FROM endpoints;
