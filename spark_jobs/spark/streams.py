"""A micro-batch's identity: the stream's checkpoint identity plus Spark's batch number.

Spark numbers micro-batches 0, 1, 2... per checkpoint. A bare number would make
a query started on a fresh checkpoint skip every batch whose number was used
before, as a "replay": silently. So the batch id is ``<query id>/<n>``, where
the query id is the one Spark keeps in ``<checkpoint>/metadata``: stable when
the query restarts from its checkpoint (its replays are recognised and
skipped), new for a new checkpoint (nothing can collide with an old batch;
its effects deduplicate by key instead, changed payloads counted).

Where it comes from: Spark sets the local property ``sql.streaming.queryId`` on
the thread that runs each micro-batch, ``foreachBatch`` functions included; or,
when the caller passes ``checkpoint=``, the ``id`` in ``<checkpoint>/metadata``.
Under Spark Connect the function runs on the server, where no such property
reaches it (sessions.py): there the checkpoint is the only way, read where the
function runs (the server), a local file directly, any other file system
through Spark's own reader. Where neither is available the sink refuses the
batch before writing anything, naming the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_outbox.core.errors import ConfigurationError
from spark_outbox.spark import sessions

QUERY_ID_PROPERTY = "sql.streaming.queryId"


def stream_batch_id(batch_df: Any, spark_batch_id: int, checkpoint: str | Path | None) -> str:
    """``<query id>/<n>`` for micro-batch ``spark_batch_id``; refuses without an identity."""
    session = batch_df.sparkSession
    if checkpoint is not None:
        query_id: str | None = read_query_id(session, str(checkpoint))
    else:
        query_id = sessions.local_property(session, QUERY_ID_PROPERTY)
    if not query_id and sessions.is_connect(session):
        raise ConfigurationError(
            f"micro-batch {spark_batch_id}: no stream identity (under Spark Connect the "
            "foreachBatch function runs on the server, where Spark's query id does not "
            "reach it); pass checkpoint=<the query's checkpointLocation> to "
            "OutboxSink.foreach_batch (the same path the query is given), or write the "
            "stream with writeStream.format('outbox')"
        )
    if not query_id:
        raise ConfigurationError(
            f"micro-batch {spark_batch_id}: no stream identity (Spark's query id is not set "
            "on this thread: the function is not running inside a streaming query's "
            "foreachBatch); run it through writeStream.foreachBatch(...) with a "
            "checkpointLocation, or pass checkpoint=<the query's checkpoint directory> "
            "to OutboxSink.foreach_batch"
        )
    return f"{query_id}/{spark_batch_id}"


def read_query_id(session: Any, checkpoint: str) -> str:
    """The query id in ``<checkpoint>/metadata``: a local path is read directly, a URI
    (``hdfs://``, ``s3a://``...) through Spark's reader, as the query itself reads it."""
    if "://" not in checkpoint or checkpoint.startswith("file://"):
        return checkpoint_query_id(Path(checkpoint.removeprefix("file://")))
    metadata = f"{checkpoint.rstrip('/')}/metadata"
    try:
        first = session.read.text(metadata).first()
        return str(json.loads(first["value"])["id"])
    except Exception as exc:  # Spark's errors have no common root but Exception
        raise ConfigurationError(
            f"checkpoint={checkpoint}: cannot read the query id from {metadata} ({exc}); "
            "pass the checkpointLocation of the query this sink writes for (Spark creates "
            "the file when the query starts)"
        ) from exc


def checkpoint_query_id(checkpoint: Path) -> str:
    """The query id Spark stores in ``<checkpoint>/metadata`` (its first line, JSON)."""
    metadata = checkpoint / "metadata"
    try:
        first_line = metadata.read_text().splitlines()[0]
        return str(json.loads(first_line)["id"])
    except (OSError, IndexError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(
            f"checkpoint={checkpoint}: cannot read the query id from {metadata} ({exc}); "
            "pass the checkpointLocation of the query this sink writes for (Spark creates "
            "the file when the query starts)"
        ) from exc
