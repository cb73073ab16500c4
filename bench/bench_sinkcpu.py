"""``python -m bench sinkcpu``: the sink executors' Python CPU per row, stage by stage.

    ... -- --code /tmp/main     (this tree's checks against a checkout's, e.g. main's
                                 ``git archive`` unpacked: the A/B of a change)

Spark hands an executor's Python Arrow record batches; what the sink's write task
does with them before PostgreSQL sees a byte is Python's CPU, paid per row. This
bench runs those stages without Spark or a database on the rows of ``bench sink``
(its key, endpoint, recipient and ~230-byte payload as Spark's ``to_json`` writes
it), in batches of Spark's default ``maxRecordsPerBatch``: ``checks``
(``checked_effects``: the column checks, canonical JSON, its hash) and ``encode``
(sort by key, binary COPY stream). Each ``--code`` checkout's ``checks`` is a
contender: its output must equal this tree's, byte for byte (canonical payloads,
hashes, rejects), or the bench stops. Rounds are interleaved (the order turns each
round); medians of CPU seconds (this process only: no threads run) per row. The
whole write task costs more (Arrow's hand-over from the JVM, the COPY itself):
``bench sink`` measures that; this one says where the executors' Python goes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ENDPOINTS = {"bench-hook": "webhook"}
RUN_ID = "00000000-0000-0000-0000-0000000000b1"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench sinkcpu", description=__doc__.split("\n\n")[1])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-rows", type=int, default=10_000, help="Arrow batch size")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds")
    parser.add_argument("--code", action="append", default=[], metavar="PATH",
                        help="add a contender: the checks of the checkout at PATH")  # fmt: skip
    args = parser.parse_args(argv)
    from spark_outbox.spark import checks, chunks
    from spark_outbox.spark.protocol import RunTag

    batches = [_batch(start, min(args.batch_rows, args.rows - start))
               for start in range(0, args.rows, args.batch_rows)]  # fmt: skip
    contenders: dict[str, Callable[..., Any]] = {"checks (this tree)": checks.checked_effects}
    for path in args.code:
        contenders[f"checks ({path})"] = _checks_of(Path(path)).checked_effects
    want = [checks.checked_effects(b, ENDPOINTS) for b in batches]
    for name, check in contenders.items():
        if _values([check(b, ENDPOINTS) for b in batches]) != _values(want):
            print(f"{name}: its output differs from this tree's; no comparison")
            return 1
    import pyarrow as pa

    valid = pa.concat_tables([v for v, _ in want])
    run = RunTag("", "bench", "sinkcpu", RUN_ID, ENDPOINTS)
    stages = {**{n: _per_batch(c, batches) for n, c in contenders.items()},
              "encode (this tree)": lambda: chunks._tagged_copy(valid, run)}  # fmt: skip
    cpu = _interleaved(stages, args.repeat)
    _print(cpu, args)
    return 0


def _values(checked: list[tuple[Any, Any]]) -> list[Any]:
    """The rows of each (valid, rejects) pair: values, not Arrow types, must agree."""
    return [(valid.to_pylist(), rejects.to_pylist()) for valid, rejects in checked]


def _batch(start: int, n: int) -> Any:
    """``bench sink``'s rows ``start .. start + n``, as the sink's effect frame has them."""
    import pyarrow as pa

    from spark_outbox.core.keys import effect_key

    ids = range(start, start + n)
    memo = "x" * 110
    payloads = [
        f'{{"type":"invoice.created","invoice":{i},"customer":"c{i}","date":"2026-01-01",'
        f'"currency":"EUR","amount":"{i % 997 * 1.25:.4f}","memo":"{memo}"}}'
        for i in ids
    ]
    text, nulls = pa.string(), pa.nulls(n, pa.string())
    never = pa.nulls(n, pa.timestamp("us", tz="UTC"))
    columns = {
        "idempotency_key": pa.array([effect_key("bench", i) for i in ids], text),
        "endpoint": pa.array(["bench-hook"] * n, text),
        "recipient": pa.array([f"c{i}@example.test" for i in ids], text),
        "payload": pa.array(payloads, text),
        "ordering_key": nulls, "reference": nulls, "supersedes": nulls, "reject_reason": nulls,
        "not_before": never, "expires_at": never,
    }  # fmt: skip
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def _checks_of(tree: Path) -> Any:
    """The checks module of another checkout (it imports this tree's ground floor)."""
    path = tree / "spark_jobs" / "spark" / "checks.py"
    spec = importlib.util.spec_from_file_location(f"checks_of_{abs(hash(tree))}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--code {tree}: no {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _per_batch(check: Callable[..., Any], batches: list[Any]) -> Callable[[], object]:
    def run() -> None:
        for batch in batches:
            check(batch, ENDPOINTS)

    return run


def _interleaved(stages: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """CPU seconds of each stage per round; the order turns each round; one untimed first."""
    for stage in stages.values():
        stage()
    cpu: dict[str, list[float]] = {name: [] for name in stages}
    names = list(stages)
    for r in range(repeat):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            started = time.process_time()
            stages[name]()
            cpu[name].append(time.process_time() - started)
    return cpu


def _print(cpu: dict[str, list[float]], args: argparse.Namespace) -> None:
    first = statistics.median(next(iter(cpu.values())))
    print(f"{args.rows:,} rows in batches of {args.batch_rows:,}; {args.repeat} interleaved "
          f"rounds, medians; load average {os.getloadavg()[0]:.2f} at the end")  # fmt: skip
    print(f"{'stage':40s} {'us/row':>7s} {'range':>13s} {'vs first':>9s}")
    for name, seconds in cpu.items():
        per_row = [s / args.rows * 1e6 for s in seconds]
        ratio = statistics.median(seconds) / first
        print(f"{name:40s} {statistics.median(per_row):7.2f} "
              f"{min(per_row):6.2f}-{max(per_row):<6.2f} {ratio:9.2f}")  # fmt: skip
