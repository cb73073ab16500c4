"""What the sink asks of a Spark session, classic or Spark Connect.

A Spark Connect client (``SparkSession.builder.remote("sc://...")``) is a thin
gRPC client: it has no ``sparkContext`` and no ``rdd``, and a ``foreachBatch``
function runs in a Python process on the Connect server, not in the client.
The sink needs three things from a session and gets each the same way in both
kinds, or refuses:

- the application id for the batch marker: the session's conf ``spark.app.id``
  (both kinds answer it);
- a streaming query's id: Spark's thread-local property on a classic driver;
  under Connect nothing in ``foreachBatch`` can reach it, so the caller names the
  checkpoint (streams.py), never a guess;
- nothing else: partition counts are asked of Spark's planner, not of ``rdd``.
"""

from __future__ import annotations

from typing import Any


def is_connect(session: Any) -> bool:
    """True for a Spark Connect session (client side, or the server's foreachBatch worker)."""
    return type(session).__module__.startswith("pyspark.sql.connect.")


def application_id(session: Any) -> str | None:
    """The Spark application id, recorded on the batch marker (None if Spark says none)."""
    found = session.conf.get("spark.app.id", None)
    return str(found) if found else None


def local_property(session: Any, name: str) -> str | None:
    """A classic driver thread's local property; None under Connect, which has none."""
    if is_connect(session):
        return None
    found = session.sparkContext.getLocalProperty(name)
    return str(found) if found else None
