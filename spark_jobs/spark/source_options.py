"""The options of ``format("outbox")`` and the frame's schema, checked on the driver.

Options are text (``.option(k, v)``, or ``OPTIONS (k 'v')`` in SQL). They say
what ``OutboxSink``'s arguments say, with the same defaults:

| option | meaning |
|---|---|
| ``job`` | the job's name (required) |
| ``batch_id`` | a batch write's id, e.g. the date (required; not for streams) |
| ``database_url`` | PostgreSQL (default: ``DATABASE_URL`` where the driver runs) |
| ``results_table``, ``results_keys`` | the results table and its conflict keys (comma-separated) |
| ``results_apply``, ``results_add_columns`` | ``overwrite`` (default) or ``add`` these columns |
| ``on_invalid`` | ``reject`` (default) or ``fail`` |
| ``chunk_rows``, ``abandoned_after_s`` | as ``OutboxSink``'s |
| ``volume_guard`` | ``on`` (default) or ``off``; ``volume_guard.<limit>`` sets a limit |

Every refusal names the option or column and the fix, before anything is written.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from spark_outbox.core import db
from spark_outbox.core.errors import InvalidInput
from spark_outbox.spark.contract import COLUMNS as EFFECT_COLUMNS
from spark_outbox.spark.contract import OPTIONAL_TIMES, REQUIRED
from spark_outbox.spark.executor import CHUNK_ROWS
from spark_outbox.spark.guard import Limits, VolumeGuard
from spark_outbox.spark.results import ResultsSpec
from spark_outbox.spark.source_layout import EFFECTS_COLUMN, Layout

GUARD_LIMITS = ("factor", "min_effects", "max_effects", "window", "min_batches")
KNOWN = {
    "job",
    "batch_id",
    "database_url",
    "results_table",
    "results_keys",
    "results_apply",
    "results_add_columns",
    "on_invalid",
    "chunk_rows",
    "abandoned_after_s",
    "volume_guard",
    *(f"volume_guard.{name}" for name in GUARD_LIMITS),
}
SPARKS_OWN = {"checkpointlocation", "path"}  # options Spark itself passes a sink


@dataclasses.dataclass(frozen=True)
class SourceOptions:
    job: str
    database_url: str
    batch_id: str | None = None
    results: ResultsSpec | None = None
    on_invalid: str = "reject"
    chunk_rows: int = CHUNK_ROWS
    abandoned_after_s: float = 3600.0
    volume_guard: VolumeGuard = dataclasses.field(default_factory=VolumeGuard)


def parse(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    given = {str(k).lower(): str(v) for k, v in options.items()}
    unknown = sorted(set(given) - KNOWN - SPARKS_OWN)
    if unknown:
        raise InvalidInput(
            f"option {unknown[0]}", "format('outbox') has no such option", f"use {sorted(KNOWN)}"
        )
    job = _required(given, "job", "name the job, e.g. .option('job', 'billing')")
    batch_id = given.get("batch_id")
    if streaming and batch_id is not None:
        raise InvalidInput(
            "option batch_id",
            "a stream names its batches itself (<query id>/<n>, from its checkpoint)",
            "drop it from writeStream",
        )
    if not streaming and not batch_id:
        raise InvalidInput(
            "option batch_id",
            "missing: a batch write needs its id (a replay of the same id writes nothing)",
            "add .option('batch_id', <a run id such as the logical date>)",
        )
    return SourceOptions(
        job=job,
        database_url=database_url(given),
        batch_id=batch_id,
        results=_results(given),
        on_invalid=_choice(given, "on_invalid", ("reject", "fail")),
        chunk_rows=int(_number(given, "chunk_rows", CHUNK_ROWS, whole=True)),
        abandoned_after_s=_number(given, "abandoned_after_s", 3600.0),
        volume_guard=_guard(given),
    )


def layout(schema: Any, options: SourceOptions) -> Layout:
    """The frame's shape (source_layout.py), refused unless it is one of the two."""
    from pyspark.sql import types as T

    names = [f.name for f in schema.fields]
    if options.results is None:
        if EFFECTS_COLUMN in names:
            raise InvalidInput(
                f"column {EFFECTS_COLUMN}",
                "an array of effects per result row needs a results table",
                "add .option('results_table', ...) and .option('results_keys', ...)",
            )
        _check_effect_fields(schema, "column ")
        return Layout()
    nested = next((f for f in schema.fields if f.name == EFFECTS_COLUMN), None)
    element = getattr(getattr(nested, "dataType", None), "elementType", None)
    if nested is None or not isinstance(element, T.StructType):
        raise InvalidInput(
            f"column {EFFECTS_COLUMN}",
            "missing, or not an array of structs, in a frame of results",
            "add effects: array(struct(idempotency_key, endpoint, payload, ...)) per row "
            "(an empty array when a row implies none)",
        )
    _check_effect_fields(element, f"field {EFFECTS_COLUMN}.")
    columns = tuple(n for n in names if n != EFFECTS_COLUMN)
    missing = [k for k in options.results.conflict_keys if k not in columns]
    if missing:
        raise InvalidInput(
            f"column {missing[0]}", "a results key the frame lacks", "add it or fix results_keys"
        )
    return Layout(result_columns=columns, result_keys=options.results.conflict_keys)


def _check_effect_fields(struct: Any, where: str) -> None:
    from pyspark.sql import types as T

    fields = {f.name: f.dataType for f in struct.fields}
    for name in fields:
        if name not in EFFECT_COLUMNS:
            raise InvalidInput(
                f"{where}{name}",
                "not a column of the effect contract",
                f"drop or rename it; the contract has {list(EFFECT_COLUMNS)}",
            )
    for name in REQUIRED:
        if name not in fields:
            raise InvalidInput(f"{where}{name}", "missing", f"add it; required: {list(REQUIRED)}")
    for name, kind in fields.items():
        times = (T.TimestampType, T.TimestampNTZType, T.DateType)
        wanted, fix = (
            (times, "cast it to timestamp")
            if name in OPTIONAL_TIMES
            else ((T.StringType,), "select to_json(...) or cast it to string")
        )
        if not isinstance(kind, wanted):
            raise InvalidInput(f"{where}{name}", f"is {kind.simpleString()}", fix)


def _required(given: dict[str, str], name: str, fix: str) -> str:
    value = given.get(name, "").strip()
    if not value:
        raise InvalidInput(f"option {name}", "missing", fix)
    return value


def database_url(options: Mapping[str, str]) -> str:
    """The option, else ``DATABASE_URL`` where this runs (the driver, the Connect server)."""
    given = {str(k).lower(): str(v) for k, v in options.items()}
    url = given.get("database_url") or os.environ.get("DATABASE_URL", "")
    if not url:
        raise InvalidInput(
            "option database_url",
            "missing, and DATABASE_URL is not set where the driver runs",
            "set DATABASE_URL for the driver (the Connect server) or add the option",
        )
    return db.check_url(url, "option database_url (or DATABASE_URL)")


def _results(given: dict[str, str]) -> ResultsSpec | None:
    table = given.get("results_table")
    if table is None:
        return None
    keys = _names(given.get("results_keys", ""))
    if not keys:
        raise InvalidInput(
            "option results_keys", "missing", "name the table's conflict keys, e.g. 'invoice_id'"
        )
    return ResultsSpec(
        table,
        keys,
        apply=_choice(given, "results_apply", ("overwrite", "add")),
        add_columns=_names(given.get("results_add_columns", "")),
    )


def _guard(given: dict[str, str]) -> VolumeGuard:
    if _choice(given, "volume_guard", ("on", "off")) == "off":
        return VolumeGuard.off()
    default = Limits()
    limits = {
        name: _number(given, f"volume_guard.{name}", getattr(default, name), whole=name != "factor")
        for name in GUARD_LIMITS
        if f"volume_guard.{name}" in given
    }
    return VolumeGuard(Limits(**limits))  # type: ignore[arg-type]


def _choice(given: dict[str, str], name: str, choices: tuple[str, ...]) -> str:
    value = given.get(name, choices[0]).strip().lower()
    if value not in choices:
        raise InvalidInput(f"option {name}", f"{value!r} is not a choice", f"use one of {choices}")
    return value


def _number(given: dict[str, str], name: str, default: float, *, whole: bool = False) -> float:
    text = given.get(name)
    if text is None:
        return default
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        kind = "a whole number" if whole else "a number"
        raise InvalidInput(f"option {name}", f"{text!r} is not {kind}", f"give {kind}") from None
    if value <= 0:
        raise InvalidInput(f"option {name}", f"{text!r} is not above 0", "give a positive number")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())
