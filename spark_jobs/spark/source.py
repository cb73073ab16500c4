"""``format("outbox")``: the sink as a Spark Python data source, batch and streaming.

    from spark_outbox.spark.source import register
    register(spark)  # once per session, classic or Spark Connect
    (effects.write.format("outbox").mode("append")
        .option("job", "billing").option("batch_id", "2026-01-01").save())
    stream.writeStream.format("outbox").option("job", "events")
        .option("checkpointLocation", "cp/").start()

and from SQL, through a temporary view defined with ``USING outbox`` (Spark
hands a catalog table's OPTIONS to no Python data source; a view's it does):

    CREATE TEMPORARY VIEW billing_outbox USING outbox
        OPTIONS (job 'billing', batch_id '2026-01-01');
    INSERT INTO billing_outbox SELECT idempotency_key, endpoint, payload FROM ...;

Same guarantee as ``OutboxSink``, by the same code: one visibility point per
batch, replays enqueue nothing, bad rows quarantined with reasons, the volume
guard. The frame's two shapes are in source_layout.py, the options in
source_options.py, the tasks and the commit in source_tasks.py and
source_commit.py. Spark calls ``writer``/``streamWriter`` in a Python process
on the driver (the Connect server's, under Connect), whose Python must import
this package.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import DataSource

from spark_outbox.core.errors import InvalidInput
from spark_outbox.spark.contract import COLUMNS, OPTIONAL_TIMES

NAME = "outbox"
# A view or table defined without columns takes the effect contract's (effects only).
EFFECTS_DDL = ", ".join(
    f"{name} {'timestamp' if name in OPTIONAL_TIMES else 'string'}" for name in COLUMNS
)


def register(spark: Any) -> None:
    """Make ``format("outbox")`` and ``USING outbox`` known to ``spark``'s session."""
    spark.dataSource.register(OutboxDataSource)


class OutboxDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return EFFECTS_DDL

    def writer(self, schema: Any, overwrite: bool) -> Any:
        from spark_outbox.spark import source_commit, source_options
        from spark_outbox.spark.source_tasks import BatchWriter

        _refuse_overwrite(overwrite, "use .mode('append') (INSERT INTO, not INSERT OVERWRITE)")
        options = source_options.parse(self.options, streaming=False)
        layout = source_options.layout(schema, options)
        assert options.batch_id is not None
        run = source_commit.begin_batch(options)
        return BatchWriter(dict(self.options), layout, options.chunk_rows, options.batch_id, run)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from spark_outbox.core import db
        from spark_outbox.spark import runs, source_options
        from spark_outbox.spark.source_tasks import StreamWriter

        _refuse_overwrite(overwrite, "use outputMode('append') or 'update'")
        options = source_options.parse(self.options, streaming=True)
        layout = source_options.layout(schema, options)
        runs.require_schema(options.database_url)  # the tasks write before any commit
        dsn = db.libpq_url(options.database_url)
        return StreamWriter(dict(self.options), layout, options.chunk_rows, dsn, options.job)


def _refuse_overwrite(overwrite: bool, fix: str) -> None:
    if overwrite:
        raise InvalidInput(
            "mode", "overwrite: the outbox only adds (a sent effect cannot be unsent)", fix
        )
