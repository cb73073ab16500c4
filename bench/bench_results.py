"""What recording a batch's result rows costs the commit (reconciliation's record).

The sink's commit merges the staged result rows into the results table; since
migration 2721 the same statement records each row applied (its key and a digest:
``batch_result_rows``). Side by side, in interleaved rounds on one database, the
same staged invoice rows merged by:

- ``merge, not recorded``: the statement of the release before (the peer);
- ``merge, recorded``: ``spark_outbox.spark.results.merge``, what commits now.

Each round truncates the table and the record and stages the rows afresh, so every
merge inserts ``--rows`` new invoices in one transaction. Reported: medians of the
merge's wall time, rows/s, and the added microseconds per row.

    flock /tmp/outbox-bench.lock python -m bench results -- --rows 200000 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.database import bench_database
from spark_outbox.core import db
from spark_outbox.spark import results
from spark_outbox.spark.results import ResultsSpec

SPEC = ResultsSpec("invoices", ("invoice_id",), batch_columns=("job", "batch_id"))
COLUMNS = (
    "invoice_id", "customer_id", "invoice_date", "currency", "amount", "units",
    "event_count", "customer_email", "job", "batch_id",
)  # fmt: skip
# The merge as the release before ran it (commit.sql's apply_results_template then).
PEER = """
INSERT INTO invoices ({columns})
SELECT {record_columns}
FROM staged_results s CROSS JOIN LATERAL jsonb_populate_record(NULL::invoices, s.row) r
WHERE s.run_id = :run_id AND s.task_id = ANY(:task_ids)
ON CONFLICT (invoice_id) DO UPDATE SET {assignments}
"""
STAGE = """
INSERT INTO staged_results (run_id, task_id, row)
SELECT :run_id, 1, jsonb_build_object(
    'invoice_id', 'inv-' || g, 'customer_id', 'c-' || (g % 5000),
    'invoice_date', '2026-11-27', 'currency', 'EUR', 'amount', (g % 997) || '.25',
    'units', g % 100, 'event_count', 1 + g % 7, 'customer_email', 'c' || g || '@example.com',
    'job', 'billing', 'batch_id', '2026-11-27')
FROM generate_series(1, :rows) g
"""


def _peer_statement() -> sa.TextClause:
    updates = [c for c in COLUMNS if c != "invoice_id"]
    return sa.text(
        PEER.format(
            columns=", ".join(COLUMNS),
            record_columns=", ".join(f"r.{c}" for c in COLUMNS),
            assignments=", ".join(f"{c} = EXCLUDED.{c}" for c in updates),
        )
    )


def _round(engine: Engine, rows: int, recorded: bool) -> float:
    run_id = str(uuid.uuid4())
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE invoices, batch_result_rows, staged_results"))
        conn.execute(sa.text(STAGE), {"run_id": run_id, "rows": rows})
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE staged_results"))
    started = time.perf_counter()
    with engine.begin() as conn:
        if recorded:
            merged = results.merge(conn, SPEC, COLUMNS, run_id=run_id, task_ids=[1], batch_ref=1)
        else:
            params = {"run_id": run_id, "task_ids": [1]}
            merged = conn.execute(_peer_statement(), params).rowcount
    seconds = time.perf_counter() - started
    assert merged == rows, (merged, rows)
    return seconds


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench results")
    p.add_argument("--rows", type=int, default=200_000, help="result rows a merge (200000)")
    p.add_argument("--rounds", type=int, default=5, help="rounds of each contender (5)")
    args = p.parse_args(argv)
    with bench_database() as url:
        db.upgrade(url, db.BILLING_HEAD)
        engine = db.create_engine(url, pool_size=1)
        try:
            times: dict[str, list[float]] = {"merge, not recorded": [], "merge, recorded": []}
            for _ in range(args.rounds):  # interleaved: the machine's noise hits both
                times["merge, not recorded"].append(_round(engine, args.rows, False))
                times["merge, recorded"].append(_round(engine, args.rows, True))
        finally:
            engine.dispose()
    load = os.getloadavg()
    print(f"{args.rows:,} result rows a merge, {args.rounds} interleaved rounds, load {load}")
    peer = statistics.median(times["merge, not recorded"])
    for name, seconds in times.items():
        median = statistics.median(seconds)
        print(
            f"  {name:22} median {median:6.2f} s  {args.rows / median:>9,.0f} rows/s  "
            f"(rounds: {', '.join(f'{s:.2f}' for s in seconds)})"
        )
    added_us = (statistics.median(times["merge, recorded"]) - peer) / args.rows * 1e6
    print(f"  recording adds {added_us:.1f} us a row to the merge (medians)")
    return 0
