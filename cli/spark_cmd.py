"""``outbox spark``: generate sample usage events, run the billing job, package this
project for a cluster's executors."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any

from spark_outbox.cli import extras, output
from spark_outbox.cli.database import database_url
from spark_outbox.core import db, endpoints, tracing
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings
from spark_outbox.spark import runs, shipping
from spark_outbox.spark.guard import Limits, VolumeGuard


def register(sub: Any) -> None:
    p = sub.add_parser("spark", help="the Spark side: sample data and the billing job")
    cmds = p.add_subparsers(dest="spark_command", required=True, metavar="ACTION")
    gen = cmds.add_parser("generate", help="write deterministic usage events (JSON lines)")
    gen.add_argument("--customers", type=int, default=100, help="how many customers")
    gen.add_argument("--events", type=int, default=10_000, help="how many usage events")
    gen.add_argument("--seed", type=int, default=1, help="seed of the generator")
    gen.add_argument("--bad-rows", type=int, default=0, help="rows the job must reject")
    gen.add_argument("--days", type=int, default=3, help="days of events, one file each")
    gen.add_argument("--start", default="2026-01-01", help="first day (YYYY-MM-DD)")
    gen.add_argument("--out", type=Path, required=True, help="directory to write into")
    gen.set_defaults(handler=generate)
    run = cmds.add_parser("run", help="run a job on Spark (local[2] unless --master)")
    run.add_argument("job", choices=["billing"])
    run.add_argument(
        "--mode", choices=["batch", "stream"], default="batch", help="a batch job or a stream"
    )
    run.add_argument("--input", type=Path, required=True, help="directory of event files")
    run.add_argument(
        "--date",
        action="append",
        help="batch mode: day to bill, YYYY-MM-DD, read from INPUT/events-<date>.json; "
        "repeatable (default: none, required in batch mode)",
    )
    run.add_argument(
        "--checkpoint",
        type=Path,
        help="stream mode: checkpoint directory (default: none, required in stream mode)",
    )
    run.add_argument(
        "--master",
        help="Spark master URL, e.g. spark://host:7077 (default: spark-submit's, else local[2])",
    )
    run.add_argument(
        "--remote",
        help="run through a Spark Connect server, e.g. sc://host:15002 (its master and "
        "its Python, which must have this package, run the job; paths are as the server "
        "sees them) (default: none, a classic driver in this process)",
    )
    run.add_argument(
        "--available-now",
        "--until-idle",
        action="store_true",
        help="stream mode: process what is there, then stop",
    )
    run.add_argument("--watermark", default="1 hour", help="stream mode: event-time delay")
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="batch mode: compute each date and preview it (new, unchanged and changed "
        "effects, rejects, the volume guard's verdict); writes nothing",
    )
    run.add_argument(
        "--json", action="store_true", help="--dry-run: one JSON object per date (default: text)"
    )
    run.add_argument(
        "--no-ship",
        action="store_true",
        help="do not send this package to the executors: their Python has it installed "
        "(default: sent, as `outbox spark package` builds it, to every master but local)",
    )
    _guard_args(run)
    run.set_defaults(handler=run_job, extras=("spark",))
    pack = cmds.add_parser(
        "package",
        help="write this package as a zip for the executors (spark-submit --py-files) "
        "and the requirements their Python must install",
    )
    pack.add_argument("--out", type=Path, required=True, help="directory to write into")
    pack.set_defaults(handler=package)


def _guard_args(run: argparse.ArgumentParser) -> None:
    """The volume guard's limits for every endpoint of the job (spark_outbox.spark.guard)."""
    d = Limits()
    run.add_argument(
        "--no-volume-guard",
        action="store_true",
        help="do not hold outsized batches (default: the guard is on, docs/spark.md)",
    )
    run.add_argument(
        "--guard-factor",
        type=float,
        default=d.factor,
        help=f"hold a batch above this many times the baseline (default {d.factor:g})",
    )
    run.add_argument(
        "--guard-min-effects",
        type=int,
        default=d.min_effects,
        help=f"the factor never holds fewer new effects (default {d.min_effects})",
    )
    run.add_argument(
        "--guard-max-effects",
        type=int,
        help="hold any batch with more new effects for one endpoint (default: no cap)",
    )
    run.add_argument(
        "--guard-window",
        type=int,
        default=d.window,
        help=f"batches the baseline median is taken over (default {d.window})",
    )
    run.add_argument(
        "--guard-min-batches", type=int, default=d.min_batches,
        help=f"no baseline before this many batches (default {d.min_batches})",
    )  # fmt: skip


def volume_guard(args: argparse.Namespace) -> VolumeGuard:
    if args.no_volume_guard:
        return VolumeGuard.off()
    return VolumeGuard(
        Limits(
            factor=args.guard_factor,
            min_effects=args.guard_min_effects,
            max_effects=args.guard_max_effects,
            window=args.guard_window,
            min_batches=args.guard_min_batches,
        )
    )


def generate(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.billing.generate import generate as write_events

    made = write_events(
        args.out,
        customers=args.customers,
        events=args.events,
        seed=args.seed,
        bad_rows=args.bad_rows,
        start=dt.date.fromisoformat(args.start),
        days=args.days,
    )
    print(json.dumps({**dataclasses.asdict(made), "files": [str(f) for f in made.files]}))
    return 0


def run_job(args: argparse.Namespace, settings: Settings) -> int:
    from spark_outbox.billing import run as billing_run
    from spark_outbox.billing.session import build_session

    if args.mode == "batch" and not args.date:
        raise ConfigurationError("batch mode: pass --date YYYY-MM-DD (one or more)")
    if args.mode == "stream" and args.dry_run:
        raise ConfigurationError("--dry-run previews batch mode only: pass --mode batch --date DAY")
    if args.mode == "stream" and args.checkpoint is None:
        raise ConfigurationError("stream mode: pass --checkpoint DIR (it makes restarts resume)")
    _check_input(args.input, args.date if args.mode == "batch" else [])
    tracing.serve_as("outbox-spark-job")  # OTEL_SERVICE_NAME, if set, wins
    options = {"volume_guard": volume_guard(args)}  # a bad limit fails before Spark starts
    url = database_url(settings)
    runs.require_schema(url)  # before the example's migration and Spark: touch nothing
    _check_endpoints(url)
    db.upgrade(url, db.BILLING_HEAD)  # the example's own table (its migration branch)
    if args.remote and args.master:
        raise ConfigurationError("pass --master or --remote, not both: the server has its master")
    if args.remote:
        extras.require(("connect",), "outbox spark run --remote")
    spark = build_session(f"outbox-billing-{args.mode}", args.master, remote=args.remote)
    shipped = tempfile.TemporaryDirectory(prefix="outbox-executors-")  # lives as long as spark
    try:
        if not (args.no_ship or args.remote):  # a Connect server's Python has the package
            shipping.ship(spark, Path(shipped.name))
        if args.mode == "batch":
            for date in args.date:
                outcome = billing_run.run_batch(
                    spark, args.input, date, url, dry_run=args.dry_run, **options
                )
                text = args.dry_run and not args.json
                shown = preview_text(outcome) if text else output.dumps(outcome)
                print(shown, flush=True)
            return 0
        queries = billing_run.start_stream(
            spark,
            args.input,
            args.checkpoint,
            url,
            available_now=args.available_now,
            watermark=args.watermark,
            **options,
        )
        stopping = _stop_on_signal()
        while not stopping.is_set():
            active = [q for q in queries if q.isActive]
            if not active:
                break
            active[0].awaitTermination(1)
        for query in queries:
            query.stop()
        failed = [q for q in queries if q.exception() is not None]
        if failed:
            raise failed[0].exception()
        print(json.dumps({"stream": "stopped", "queries": [q.name for q in queries]}), flush=True)
        return 0
    finally:
        spark.stop()
        shipped.cleanup()


def package(args: argparse.Namespace, settings: Settings) -> int:
    made = shipping.build(args.out)
    print(
        f"wrote {made.zip_path}: this package, for the executors' Python path\n"
        f"wrote {made.requirements_path}: {' '.join(made.requirements)}\n"
        "on every worker, in the Python that PYSPARK_PYTHON names:\n"
        f"  pip install -r {made.requirements_path}\n"
        "spark-submit options:\n"
        f"  --py-files {made.zip_path}\n"
        "(`outbox spark run --master URL` ships the package itself; pass --no-ship "
        "where the workers have it installed)"
    )
    return 0


def _check_endpoints(url: str) -> None:
    """The example's endpoints must exist before it runs: the sink would keep every
    effect naming an unregistered endpoint as a reject and commit the batch, and a
    re-run of a committed batch is a replay that enqueues nothing."""
    from spark_outbox.billing.job import EMAIL_ENDPOINT, WEBHOOK_ENDPOINT

    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            known = {e.name for e in endpoints.list_all(conn)}
    finally:
        engine.dispose()
    missing = [name for name in (WEBHOOK_ENDPOINT, EMAIL_ENDPOINT) if name not in known]
    if missing:
        raise ConfigurationError(
            f"the billing job's endpoint(s) {', '.join(missing)} are not registered; "
            "add them first (`outbox endpoints add webhook billing-webhook --url ...`, "
            "`outbox endpoints add email billing-email --smtp-host ...`): a batch run "
            "without them would commit its effects as rejects"
        )


def preview_text(p: dict[str, Any]) -> str:
    """A preview (spark_outbox.spark.preview.BatchPreview as a dict) for a person."""
    lines = [
        f"{p['job']} / {p['batch_id']}: dry run, nothing written"
        + (" (committed before: a write would be a replay)" if p["committed_before"] else ""),
        f"  effects: {p['effects_total']} valid, {p['effects_new']} new{_by(p['new_by_endpoint'])}",
        f"  stored with the same payload: {sum(p['same_payload'].values())}"
        f"{_by(p['same_payload'])}",
        f"  stored with another payload: {sum(p['different_payload'].values())}"
        f"{_by(p['different_payload'])}",
    ]
    for ex in p["examples"]:
        changes = ", ".join(f"{k}: {old} -> {new}" for k, (old, new) in ex["diff"].items())
        lines.append(f"    {ex['idempotency_key'][:16]}… ({ex['state']}): {changes}")
    lines.append(f"  rejects: {p['rejects']}{_by(p['reject_reasons'])}")
    lines.append(f"  result rows: {p['result_rows']}")
    verdict = f"HELD: {p['would_hold']}" if p["would_hold"] else "flows (not held)"
    lines.append(f"  volume guard: {verdict}")
    return "\n".join(lines)


def _by(counts: dict[str, int]) -> str:
    return " (" + ", ".join(f"{k}: {n}" for k, n in counts.items()) + ")" if counts else ""


def _check_input(input_dir: Path, dates: list[str]) -> None:
    """Missing input is a one-line error naming the file expected, before Spark starts
    (Spark's own answer is a 20-line Py4J traceback)."""
    from spark_outbox.billing.run import batch_input

    if not input_dir.is_dir():
        raise ConfigurationError(
            f"--input {input_dir}: no such directory; `outbox spark generate --out DIR` "
            "writes sample events"
        )
    for date in dates:
        try:
            dt.date.fromisoformat(date)
        except ValueError:
            raise ConfigurationError(f"--date {date!r}: write the day as YYYY-MM-DD") from None
        expected = batch_input(input_dir, date)
        if not expected.is_file():
            present = sorted(p.name for p in input_dir.glob("events-*.json"))[:5]
            raise ConfigurationError(
                f"--date {date}: no input file {expected}; batch mode reads one file per "
                f"day named events-YYYY-MM-DD.json in --input (found: "
                f"{', '.join(present) or 'none'})"
            )


def _stop_on_signal() -> threading.Event:
    """SIGTERM/SIGINT only set an event; the main loop stops the queries.

    Stopping them from the handler re-enters py4j while the main thread waits
    in awaitTermination ("reentrant call"), and the process exited 1.
    """
    stopping = threading.Event()

    def stop(signum: int, frame: Any) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return stopping
