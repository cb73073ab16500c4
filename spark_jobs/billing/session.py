"""The SparkSession builder: the one place a Spark session is configured.

Jobs never build sessions themselves (a job is a pure transformation).
Loopback only, UTC session time zone (so dates and keys mean the same
instant everywhere), no UI, few shuffle partitions for small local runs, the
console progress bar only on a terminal.
"""

from __future__ import annotations

import os
import sys
from typing import Any

DEFAULT_MASTER = "local[2]"


# What a Spark Connect session may set for itself (SQL confs); the rest is the server's.
CONNECT_CONF = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
}


def build_session(
    app_name: str = "spark-outbox",
    master: str | None = None,
    *,
    remote: str | None = None,
    **conf: Any,
) -> Any:
    """Return a SparkSession (``pyspark.sql.SparkSession``) for ``master``, or a Spark
    Connect session to the server at ``remote`` (``sc://host:port``).

    Without ``master``: the one ``spark-submit --master`` gave (it starts this
    process with ``PYSPARK_GATEWAY_PORT`` set), else ``local[2]``.
    """
    if remote is not None:
        return connect_session(remote, **conf)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers run this interpreter (its venv has pyarrow and psycopg2),
    # unless the environment says otherwise (a cluster's own Python).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if master is not None or "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master(master or DEFAULT_MASTER)
    builder = (
        builder.appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        # The stage progress bar redraws with carriage returns: on a terminal it
        # is a progress bar, in a log file or a pipe it is noise.
        .config("spark.ui.showConsoleProgress", str(sys.stderr.isatty()).lower())
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def connect_session(remote: str, **conf: Any) -> Any:
    """A new Spark Connect session (``create``: never another caller's) with the job's
    SQL confs; the master, the executors and their Python are the server's."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote(remote)
    for key, value in {**CONNECT_CONF, **conf}.items():
        builder = builder.config(key, value)
    return builder.create()
