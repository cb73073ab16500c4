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
Where neither is available the sink refuses the batch before writing anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spark_outbox.core.errors import ConfigurationError

QUERY_ID_PROPERTY = "sql.streaming.queryId"


def stream_batch_id(batch_df: Any, spark_batch_id: int, checkpoint: str | Path | None) -> str:
    """``<query id>/<n>`` for micro-batch ``spark_batch_id``; refuses without an identity."""
    query_id = (
        checkpoint_query_id(Path(checkpoint))
        if checkpoint is not None
        else batch_df.sparkSession.sparkContext.getLocalProperty(QUERY_ID_PROPERTY)
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
