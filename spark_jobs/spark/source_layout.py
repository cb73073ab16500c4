"""The two shapes of a frame written with ``format("outbox")``, taken apart on an executor.

- **Effects only**: the frame's columns are the effect contract's
  (spark_outbox.spark.contract): ``idempotency_key``, ``endpoint``, ``payload``
  (JSON text) and any optional ones. For pipelines whose results live elsewhere.
- **Results with their effects**: every column but ``effects`` is a result
  column, applied to the results table; ``effects`` is an array of effect
  structs (the contract's fields) that the row implies. A row whose result
  keys are all NULL carries effects only (an input event that becomes no
  result, only a reject): a result row without its key could not be applied.

Each Arrow batch Spark hands a task becomes what the sink's executors handle:
the effects as a batch of the contract's columns, in its order and types (as
``contract.effect_frame`` makes them in Spark), and the result rows as JSON
text for ``staged_results`` (``jsonb_populate_record`` reads them at commit).
Executors import this module: pyarrow and orjson only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spark_outbox.spark.contract import COLUMNS, OPTIONAL_TIMES

EFFECTS_COLUMN = "effects"


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which shape a frame has; checked on the driver against the frame's schema."""

    result_columns: tuple[str, ...] = ()  # empty: effects only
    result_keys: tuple[str, ...] = ()  # all NULL in a row: that row has no result

    @property
    def with_results(self) -> bool:
        return bool(self.result_columns)


def split(batch: Any, layout: Layout) -> tuple[Any, Any]:
    """(effects in the contract's columns, result rows as JSON text or None)."""
    if not layout.with_results:
        return contract_batch(_fields(batch), batch.num_rows), None
    nested = batch.column(batch.schema.get_field_index(EFFECTS_COLUMN))
    effects = nested.flatten()  # a NULL array is no effect; a NULL struct, a reject
    fields = {f.name: effects.field(i) for i, f in enumerate(effects.type)}
    return contract_batch(fields, len(effects)), result_rows(batch, layout)


def contract_batch(fields: dict[str, Any], rows: int) -> Any:
    """The contract's columns in order: text as string, times as UTC timestamps, a
    missing optional column as NULLs (what ``effect_frame`` gives the sink's tasks)."""
    import pyarrow as pa

    arrays = []
    for name in COLUMNS:
        kind = pa.timestamp("us", tz="UTC") if name in OPTIONAL_TIMES else pa.string()
        found = fields.get(name)
        arrays.append(pa.nulls(rows, kind) if found is None else found.cast(kind))
    return pa.RecordBatch.from_arrays(arrays, names=list(COLUMNS))


def result_rows(batch: Any, layout: Layout) -> Any:
    """Each row with a result as one JSON object (column -> value), as ``to_json`` of
    the row would: decimals as text, which jsonb_populate_record reads exactly."""
    import orjson
    import pyarrow as pa

    table = pa.Table.from_batches([batch]).select(list(layout.result_columns))
    texts = [
        orjson.dumps(row, default=_json_value).decode()
        for row in table.to_pylist()
        if any(row[key] is not None for key in layout.result_keys)
    ]
    return pa.array(texts, pa.string())


def _fields(batch: Any) -> dict[str, Any]:
    return {name: batch.column(i) for i, name in enumerate(batch.schema.names)}


def _json_value(value: Any) -> Any:
    from decimal import Decimal

    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} has no JSON form")
