"""Retention at size: purge speed at 1M effects / 3M attempts, and what a running purge
costs a concurrent drain.

    python -m bench purge -- [--effects 1000000] [--drain 20000] [--rounds 3]
                             [--batch-size 1000] [--pace 1 --pace 0.25 ...]

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
3. drain + purge: the same drain while the next slice is purged in a thread at
   ``--pace`` (the share of the time it works, resting after each batch:
   ``retention.rest_after``, as a dispatcher's own purge does); deliveries/s counted
   over the time both ran.
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
    p.add_argument(
        "--pace",
        type=float,
        action="append",
        help="a pace of the purge beside the drain (the share of the time it works; "
        "repeat for several, each its own drain in every round; default: 1)",
    )
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


def _purge(
    engine: Engine, cutoff: dt.datetime, batch_size: int, pace: float = 1.0
) -> tuple[int, int, list[float]]:
    effects = attempts = 0
    batches_ms: list[float] = []
    after: tuple[object, object] | None = retention.START
    while after is not None:
        t0 = time.perf_counter()
        got = retention.purge_batch(engine, "purge_batch", cutoff, batch_size, after)
        worked = time.perf_counter() - t0
        if got.last is not None:
            batches_ms.append(worked * 1000)
            effects, attempts = effects + got.removed, attempts + got.attempts
            if pace < 1.0:
                time.sleep(retention.rest_after(worked, pace))
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
    drain_alone: list[float] = dataclasses.field(default_factory=list)  # deliveries/s
    # by pace: the purge's effects/s beside the drain, and the drain's deliveries/s
    purge_during: dict[float, list[float]] = dataclasses.field(default_factory=dict)
    drain_with: dict[float, list[float]] = dataclasses.field(default_factory=dict)


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

    def __init__(self, engine: Engine, cutoff: dt.datetime, batch_size: int, pace: float) -> None:
        super().__init__(name="purger")
        self.engine, self.cutoff, self.batch_size, self.pace = engine, cutoff, batch_size, pace
        self.rate = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        effects, _, _ = _purge(self.engine, self.cutoff, self.batch_size, self.pace)
        self.rate = effects / (time.perf_counter() - t0)


def _round(
    engine: Engine, args: argparse.Namespace, r: int, cutoffs: list[dt.datetime], figures: Figures
) -> None:
    """Purge alone, then the drain alone and beside a purge at each pace, in an order
    that turns round every round; each purge takes a slice of its own."""
    print(f"round {r + 1}:")
    slices = iter(cutoffs[r * (1 + len(args.pace)) : (r + 1) * (1 + len(args.pace))])
    figures.purge_alone.append(_purge_alone(engine, next(slices), args.batch_size))
    runs: list[float | None] = [None, *args.pace]
    for pace in runs if r % 2 == 0 else list(reversed(runs)):
        if pace is None:
            rate = _drain(engine, args.drain, f"a{r}-", None)
            figures.drain_alone.append(rate)
            print(f"  drain alone: {rate:,.0f} deliveries/s")
            continue
        purger = Purger(engine, next(slices), args.batch_size, pace)
        rate = _drain(engine, args.drain, f"w{r}-{pace:g}-", purger)
        figures.drain_with.setdefault(pace, []).append(rate)
        figures.purge_during.setdefault(pace, []).append(purger.rate)
        print(
            f"  drain beside a purge at pace {pace:g}: {rate:,.0f} deliveries/s, the purge "
            f"{purger.rate:,.0f} effects/s (VACUUM after it: {_vacuum(engine):.1f} s)"
        )


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
    alone = statistics.median(f.drain_alone)
    print(
        f"\nmedians of {args.rounds} interleaved rounds ({args.effects:,} effects / "
        f"{3 * args.effects:,} attempts loaded, purge batches of {args.batch_size}):"
    )
    print(f"  purge alone            {statistics.median(f.purge_alone):10,.0f} effects/s")
    print(f"  drain alone            {alone:10,.0f} deliveries/s")
    for pace in args.pace:
        with_purge = statistics.median(f.drain_with[pace])
        per_round = [w / a for w, a in zip(f.drain_with[pace], f.drain_alone, strict=True)]
        print(
            f"  beside a purge at pace {pace:g}: the purge "
            f"{statistics.median(f.purge_during[pace]):,.0f} effects/s, the drain "
            f"{with_purge:,.0f} deliveries/s (ratio of medians {with_purge / alone:.2f}; "
            "within each round: "
            + ", ".join(f"{x:.2f}" for x in per_round)
            + f", median {statistics.median(per_round):.2f})"
        )


def main(argv: list[str]) -> int:
    args = _parse(argv)
    args.pace = args.pace or [1.0]
    for pace in args.pace:
        retention.check_pace(pace, "--pace")
    print(f"start: {_uptime()}")
    root = Path(__file__).resolve().parents[1]
    server_url = database_url(Settings.from_env(state_dir=root / ".outbox"))
    url = scratch.clone_template(server_url, scratch.ensure_template(server_url))
    engine = db.create_engine(url, pool_size=4)
    try:
        _load(url, args.effects)
        cutoffs = _cutoffs(engine, (1 + len(args.pace)) * args.rounds)
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
