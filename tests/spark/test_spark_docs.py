"""The Spark examples of README.md and docs/spark.md run as written.

Each document's ``<!-- spark-example: NAME -->`` blocks run in order in one
namespace (they continue one another), with ``spark`` the run's session,
``url`` the database and the endpoint ``orders-webhook`` registered; then the
batches they committed are what the documents say.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from spark_outbox.core import db
from tests import ROOT
from tests.conftest import insert_endpoint
from tests.spark.helpers import table

pytestmark = pytest.mark.spark
FENCE = re.compile(r"<!-- spark-example: ([\w-]+) -->\s*```python\n(.*?)```", re.DOTALL)
MARKERS = "SELECT job, batch_id, effects_new, effects_deduplicated, result_rows FROM batches"


def _run(document: str, spark: Any, db_url: str) -> tuple[list[str], str]:
    blocks = FENCE.findall((ROOT / document).read_text())
    namespace: dict[str, Any] = {"spark": spark, "url": db.libpq_url(db_url)}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for _, code in blocks:
            exec(compile(code, document, "exec"), namespace)  # noqa: S102 (our own docs)
    return [name for name, _ in blocks], printed.getvalue()


def test_the_readme_shows_both_ways_in_and_they_run(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "orders-webhook")
    names, printed = _run("README.md", spark, db_url)
    assert names == ["readme-sink", "readme-source"]
    assert printed == "committed\n"
    assert table(engine, MARKERS + " ORDER BY 1") == [
        ("orders", "2026-01-01", 1, 0, 0),
        ("orders.source", "2026-01-01", 0, 1, 0),
    ]


def test_the_spark_docs_examples_run_both_ways_in_from_python_sql_and_a_stream(
    spark: Any, db_url: str, engine: Engine
) -> None:
    insert_endpoint(engine, "orders-webhook")
    names, printed = _run("docs/spark.md", spark, db_url)
    assert names == ["sink", "source", "stream"]
    assert printed == "committed 2\n"
    markers = table(engine, MARKERS + " ORDER BY 1, 2")
    stream = [m for m in markers if m[0] == "orders.stream"]
    assert [m for m in markers if m[0] != "orders.stream"] == [
        ("invoices", "2026-01-01", 2, 0, 2),
        ("orders", "2026-01-01", 2, 0, 0),
        ("orders.source", "2026-01-01", 0, 2, 0),
        ("orders.sql", "2026-01-02", 0, 2, 0),
    ]
    assert [(m[1].endswith("/0"), m[2]) for m in stream] == [(True, 1)]
    assert table(engine, "SELECT count(*) FROM invoices")[0][0] == 2
