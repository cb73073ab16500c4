"""Retention at size: purge speed at 1M effects / 3M attempts, and what a running purge
costs a concurrent drain.

    python -m bench purge -- [--effects 1000000] [--drain 20000] [--rounds 3]

Loads ``--effects`` finished-and-pending effects with 3 attempts each (cli/tools/
bulk.py) into a fresh database, cuts the finished ones into 2 x rounds slices by
finish time, then per round (interleaved, the drain-alone run alternating before
and after the concurrent one):
1. purge alone: one slice, batch after batch (its own transactions), timed, with
   the duration of every batch (how long its row locks are held), then the
   VACUUM of what it touched, timed too (every purge is followed by a VACUUM, so
   no drain meets autovacuum's clean-up of an earlier purge);
2. drain alone: ``--drain`` fresh effects delivered by one ``outbox dispatcher
   run`` (concurrency 64) to a local uvicorn receiver;
3. drain + purge: the same drain while the next slice is purged in a thread;
   deliveries/s counted over the time both ran.
Prints medians and the ratio drain-with-purge / drain-alone, and ``uptime`` at
start and end (the machine is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import statistics
import subprocess
import threading
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench import contenders
from bench import receiver as bench_receiver
from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.bulk import load
from spark_outbox.core import db, wakeup
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import retention

PAD = "x" * 260


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench purge", description=__doc__)
    p.add_argument("--effects", type=int, default=1_000_000, help="loaded (default 1,000,000)")
    p.add_argument("--drain", type=int, default=20_000, help="effects per drain (default 20,000)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--batch-size", type=int, default=1000, help="purge batch (default 1000)")
    return p.parse_args(argv)


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def _cutoffs(engine: Engine, slices: int) -> list[dt.datetime]:
    """Finish times that cut the finished effects into ``slices`` equal slices."""
    fractions = [i / slices for i in range(1, slices)]
    with engine.connect() as conn:
        inner = conn.execute(
            sa.text(
                "SELECT percentile_disc(CAST(:f AS float8[])) WITHIN GROUP (ORDER BY updated_at)"
                " FROM effects WHERE state IN ('delivered', 'dead', 'cancelled')"
            ),
            {"f": fractions},
        ).scalar_one()
        last = conn.execute(sa.text("SELECT max(updated_at) FROM effects")).scalar_one()
    return [*inner, last + dt.timedelta(microseconds=1)]


def _purge(engine: Engine, cutoff: dt.datetime, batch_size: int) -> tuple[int, int, list[float]]:
    effects = attempts = 0
    batches_ms: list[float] = []
    after: tuple[object, object] | None = retention.START
    while after is not None:
        t0 = time.perf_counter()
        got = retention.purge_batch(engine, "purge_batch", cutoff, batch_size, after)
        if got.last is not None:
            batches_ms.append((time.perf_counter() - t0) * 1000)
            effects, attempts = effects + got.removed, attempts + got.attempts
        after = got.last
    return effects, attempts, batches_ms


def _enqueue_drain(engine: Engine, n: int, tag: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT encode(sha256(convert_to(:tag || g, 'UTF8')), 'hex'), 'bench',"
                " jsonb_build_object('n', g, 'pad', CAST(:pad AS text)), 'x'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": n, "pad": PAD, "tag": tag},
        )
        wakeup.notify(conn, "bench")


def _delivered(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM effects WHERE endpoint = 'bench' AND state = 'delivered'"
                )
            ).scalar_one()
        )


def _drain(engine: Engine, n: int, tag: str, purge: threading.Thread | None) -> float:
    """Deliveries/s of one drain; with a purge, over the time both ran."""
    before = _delivered(engine)
    _enqueue_drain(engine, n, tag)
    t0 = time.perf_counter()
    if purge is not None:
        purge.start()
    overlap_end = overlap_count = None
    while (done := _delivered(engine) - before) < n:
        if purge is not None and overlap_end is None and not purge.is_alive():
            overlap_end, overlap_count = time.perf_counter(), done
        time.sleep(0.05)
    end = time.perf_counter()
    if purge is not None:
        purge.join()
        if overlap_end is not None and overlap_count:
            print(f"    (purge ended first: rate over its {overlap_end - t0:.1f} s)")
            return overlap_count / (overlap_end - t0)
    return n / (end - t0)


@dataclasses.dataclass
class Figures:
    purge_alone: list[float] = dataclasses.field(default_factory=list)  # effects/s
    purge_during: list[float] = dataclasses.field(default_factory=list)
    drain_alone: list[float] = dataclasses.field(default_factory=list)  # deliveries/s
    drain_with: list[float] = dataclasses.field(default_factory=list)


def _vacuum(engine: Engine) -> float:
    """VACUUM what a purge touched, so the next drain does not meet autovacuum's work
    (measured: a drain right after a purge ran at a fraction of its speed)."""
    t0 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM (ANALYZE) effects, delivery_attempts, key_ledger"))
    return time.perf_counter() - t0


def _purge_alone(engine: Engine, cutoff: dt.datetime, batch_size: int) -> float:
    effects, attempts, batches = _purge(engine, cutoff, batch_size)
    seconds = sum(batches) / 1000
    batches.sort()
    p99 = batches[min(len(batches) - 1, int(len(batches) * 0.99))]
    print(
        f"  purge alone: {effects:,} effects + {attempts:,} attempts in {seconds:.1f} s = "
        f"{effects / seconds:,.0f} effects/s, {attempts / seconds:,.0f} attempts/s; "
        f"per batch p50 {statistics.median(batches):.0f} ms, p99 {p99:.0f} ms, "
        f"max {batches[-1]:.0f} ms; then VACUUM {_vacuum(engine):.1f} s"
    )
    return effects / seconds


class Purger(threading.Thread):
    """A purge of one slice in a thread, timed."""

    def __init__(self, engine: Engine, cutoff: dt.datetime, batch_size: int) -> None:
        super().__init__(name="purger")
        self.engine, self.cutoff, self.batch_size = engine, cutoff, batch_size
        self.rate = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        effects, _, _ = _purge(self.engine, self.cutoff, self.batch_size)
        self.rate = effects / (time.perf_counter() - t0)


def _round(
    engine: Engine, args: argparse.Namespace, r: int, cutoffs: list[dt.datetime], figures: Figures
) -> None:
    print(f"round {r + 1}:")
    figures.purge_alone.append(_purge_alone(engine, cutoffs[2 * r], args.batch_size))
    for kind in ("alone", "with") if r % 2 == 0 else ("with", "alone"):
        if kind == "alone":
            rate = _drain(engine, args.drain, f"a{r}-", None)
            figures.drain_alone.append(rate)
        else:
            purger = Purger(engine, cutoffs[2 * r + 1], args.batch_size)
            rate = _drain(engine, args.drain, f"w{r}-", purger)
            figures.drain_with.append(rate)
            figures.purge_during.append(purger.rate)
            print(f"  (VACUUM after it: {_vacuum(engine):.1f} s)")
        print(f"  drain {kind:5} purge: {rate:,.0f} deliveries/s")


def _load(url: str, n: int) -> None:
    engine = db.create_engine(url, pool_size=1)
    try:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            load(conn, effects=n, attempts=3)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
    finally:
        engine.dispose()
    print(f"loaded {n:,} effects / {3 * n:,} attempts in {time.perf_counter() - t0:.1f} s")


def _report(args: argparse.Namespace, f: Figures) -> None:
    alone, with_purge = statistics.median(f.drain_alone), statistics.median(f.drain_with)
    print(
        f"\nmedians of {args.rounds} interleaved rounds ({args.effects:,} effects / "
        f"{3 * args.effects:,} attempts loaded, purge batches of {args.batch_size}):"
    )
    print(f"  purge alone            {statistics.median(f.purge_alone):10,.0f} effects/s")
    print(f"  purge during a drain   {statistics.median(f.purge_during):10,.0f} effects/s")
    print(f"  drain alone            {alone:10,.0f} deliveries/s")
    ratio = with_purge / alone
    print(f"  drain while purging    {with_purge:10,.0f} deliveries/s (ratio {ratio:.2f})")
    per_round = [w / a for w, a in zip(f.drain_with, f.drain_alone, strict=True)]
    print(
        "  ratio within each round (side by side): "
        + ", ".join(f"{r:.2f}" for r in per_round)
        + f"; median {statistics.median(per_round):.2f}"
    )


def main(argv: list[str]) -> int:
    args = _parse(argv)
    print(f"start: {_uptime()}")
    root = Path(__file__).resolve().parents[1]
    server_url = database_url(Settings.from_env(state_dir=root / ".outbox"))
    url = scratch.clone_template(server_url, scratch.ensure_template(server_url))
    engine = db.create_engine(url, pool_size=4)
    try:
        _load(url, args.effects)
        cutoffs = _cutoffs(engine, 2 * args.rounds)
        figures = Figures()
        with bench_receiver.serve() as (base, pid):
            with engine.begin() as conn:
                add_webhook(conn, name="bench", url=f"{base}/hook")
            ctx = contenders.Ctx(url=url, base=base, engine=engine, receiver_pid=pid)
            # One dispatcher process, 64 sends in flight, as this bench always drained.
            drain = contenders.start_dispatchers(ctx, 1, "--concurrency", "64")
            try:
                for r in range(args.rounds):
                    _round(engine, args, r, cutoffs, figures)
            finally:
                contenders.stop_all([drain])
        _report(args, figures)
    finally:
        engine.dispose()
        scratch.drop_database(server_url, scratch.database_name(url))
        print(f"end: {_uptime()}")
    return 0
