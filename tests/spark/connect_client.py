"""A Spark Connect client process for the tests: the numbers stream through ``--remote``.

A process holds either classic sessions or Connect ones (PySpark switches its
functions module by process), so the test run's own classic session stays
classic and each Connect client is a process of its own, as in production:

    python -m tests.spark.connect_client sc://HOST:PORT SOURCE CHECKPOINT [--checkpoint-argument]

The database is ``DATABASE_URL``; one JSON line says the query id and its error.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from spark_outbox.billing.session import connect_session
from spark_outbox.spark import sessions
from tests.spark.helpers import numbers_query, sink


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("remote")
    parser.add_argument("source", type=Path)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--checkpoint-argument", action="store_true")
    args = parser.parse_args()
    spark = connect_session(args.remote)
    try:
        stream_sink = sink(os.environ["DATABASE_URL"], results=None)
        query, error = None, None
        try:  # the query's failure, at its start or later, is reported to the test
            query = numbers_query(
                spark,
                args.source,
                args.checkpoint,
                stream_sink,
                checkpoint_argument=args.checkpoint_argument,
            )
            query.awaitTermination(300)
        except Exception as exc:
            error = str(exc)
        found = {
            "connect": sessions.is_connect(spark),
            "app_id": sessions.application_id(spark),
            "query_id": str(query.id) if query is not None else None,
            "error": error,
        }
        print(json.dumps(found), flush=True)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
