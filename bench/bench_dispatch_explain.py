"""``bench dispatch -- --auto-explain-ms N``: the bench on its own private cluster
(``.outbox-explain/``) with ``auto_explain`` loaded, so every statement slower than
N ms leaves its plan (with actual rows and buffers, no per-node timing: that
would slow every statement) in that cluster's ``postgres.log``, timestamped: the
evidence of what an outlier round spent its time on (issue 31 item 3).

The cluster has the private cluster's defaults otherwise, like the one the bench
uses without the option; it is stopped when the bench ends.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from spark_outbox.cli.tools.pgcluster import PrivateCluster

STATE_DIR = Path(__file__).resolve().parents[1] / ".outbox-explain"


def settings(min_duration_ms: int) -> dict[str, str]:
    return {
        "shared_preload_libraries": "auto_explain",
        "auto_explain.log_min_duration": f"{min_duration_ms}ms",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_timing": "off",
        "auto_explain.log_buffers": "on",
        "auto_explain.log_nested_statements": "on",
    }


@contextmanager
def explained(min_duration_ms: int) -> Iterator[Path]:
    """Point the bench (``DATABASE_URL``) at the explaining cluster; its log's path."""
    cluster = PrivateCluster(STATE_DIR, server_settings=settings(min_duration_ms))
    info = cluster.ensure_running()
    before = os.environ.get("DATABASE_URL")
    os.environ["DATABASE_URL"] = info.url
    try:
        yield cluster.log_file
    finally:
        if before is None:
            os.environ.pop("DATABASE_URL", None)
        else:
            os.environ["DATABASE_URL"] = before
        cluster.stop()
