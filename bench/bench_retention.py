"""Retention at 10M effects: purging a month while a dispatcher drains, and the size
of the outbox over fill/purge cycles.

    python -m bench retention -- --reuse DATABASE [--cycles 4] [--burst 30000]
                                 [--vacuum explicit|auto] [--pace P]

A year of history (``bench history -- --keep``: 10M effects, 30M attempts, the
ledger) is needed; it is changed for good (months are purged and filled), so
keep a copy if you need it again. Per cycle:
1. a drain alone: a committed batch of ``--burst`` effects delivered by one
   ``outbox dispatcher run`` process (its defaults) to a local receiver;
2. the same drain while the oldest month of finished effects is purged in a
   thread (``retention.purge``: effects, attempts, then the ledger's keys of the
   same month: the horizon equals the cutoff), started just before the burst's
   commit; the share of the drain the purge overlapped is printed (1.00: all of
   it); the purge's own rate: effects over its whole run, the keys' pass included,
   rests and all (``--pace P``: the purge works that share of the time, as a
   dispatcher's retention task does, ``OUTBOX_RETENTION_PACE``; its rate while
   working is printed too); the order of 1 and 2 alternates between cycles;
3. VACUUM of what the purge touched (``--vacuum explicit``; ``auto``: wait for
   autovacuum to have visited effects, attempts and the ledger since the purge);
4. a month of new finished history loaded (the fill);
5. the size of effects, attempts and the ledger (heap, TOAST, indexes).
The key indexes are read into the page cache first (``bench history``'s prewarm).
Targets (issue 30): the drain while purging >= 0.9x alone; the purge >= 50,000
effects/s; the size flat over the cycles.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import threading
import time

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench import bench_history, history_cluster, history_side
from bench import receiver as bench_receiver
from bench.bench_dispatch import uptime
from bench.history_side import Side
from spark_outbox.cli.tools import history, scratch
from spark_outbox.core import db
from spark_outbox.dispatch import retention

MONTH = dt.timedelta(days=30)
TABLES = ("effects", "delivery_attempts", "key_ledger")


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench retention", description=__doc__)
    ap.add_argument("--reuse", metavar="DATABASE", required=True, help="a kept history")
    ap.add_argument("--effects", type=int, default=10_000_000, help="its size (default 10M)")
    ap.add_argument("--cycles", type=int, default=4)
    ap.add_argument("--burst", type=int, default=30_000, help="effects per drain")
    ap.add_argument("--batch-size", type=int, default=5000, help="purge batch")
    ap.add_argument("--vacuum", choices=("explicit", "auto"), default="explicit")
    ap.add_argument(
        "--pace", type=float, default=1.0, help="share of the time the purge works (0-1]"
    )
    args = ap.parse_args(argv)
    retention.check_pace(args.pace, "--pace")  # as bench purge and `outbox purge` check it
    return args


def _size_bytes(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT sum(pg_total_relation_size(CAST(t AS regclass))) FROM unnest(:t) t"
                ),
                {"t": list(TABLES)},
            ).scalar_one()
        )


def _oldest_month(engine: Engine) -> dt.datetime:
    """The cutoff of the oldest month of finished effects (ix_effects_purgeable)."""
    with engine.connect() as conn:
        oldest: dt.datetime = conn.execute(
            sa.text(
                "SELECT min(updated_at) FROM effects"
                " WHERE purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')"
            )
        ).scalar_one()
    return oldest + MONTH


class Purger(threading.Thread):
    """One month's purge (effects, then the ledger's keys of the month), timed."""

    def __init__(
        self, engine: Engine, cutoff: dt.datetime, batch_size: int, pace: float = 1.0
    ) -> None:
        super().__init__(name="purger")
        self.engine, self.cutoff, self.batch_size = engine, cutoff, batch_size
        self.pace = pace
        self.done = retention.Purged()
        self.seconds = self.ended = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        self.done = retention.purge(
            self.engine, self.cutoff, self.batch_size, horizon=self.cutoff, pace=self.pace
        )
        self.ended = time.perf_counter()
        self.seconds = self.ended - t0


def _drain_with_purge(
    side: Side, base: str, pid: int, n: int, purger: Purger
) -> tuple[float, float]:
    """Deliveries/s of a burst drained while the purge runs (started just before the
    burst's commit), and the share of the drain the purge overlapped (1.0: all of it;
    less means the purge ended first and the figure is partly a drain alone)."""
    with history_side.dispatcher(side, base, pid):
        first = history_side.next_first(n)
        purger.start()
        t0 = time.perf_counter()
        history.burst(
            side.engine, effects=n, first=first, endpoint="bench", recipients=side.recipients
        )
        while history_side.unfinished(side.engine, "bench"):
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        overlap = (purger.ended - t0) / elapsed if not purger.is_alive() else 1.0
    purger.join()
    side.bursts.append((first, n))
    return n / elapsed, max(0.0, min(1.0, overlap))


def _vacuum(engine: Engine, how: str, since: dt.datetime) -> float:
    t0 = time.perf_counter()
    if how == "explicit":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"VACUUM {', '.join(TABLES)}"))
        return time.perf_counter() - t0
    query = sa.text(
        "SELECT count(*) FROM pg_stat_user_tables WHERE relname = ANY(:t)"
        " AND GREATEST(last_autovacuum, last_vacuum) > :since"
    )
    while True:
        with engine.connect() as conn:
            if conn.execute(query, {"t": list(TABLES), "since": since}).scalar_one() == 3:
                return time.perf_counter() - t0
        time.sleep(5)


def _fill(engine: Engine, effects: int) -> float:
    """A month of finished history, numbered after every month loaded before (by this
    run or an earlier one on the same database: a second run once reused the first
    run's numbers, and the fill's markers were refused as duplicates)."""
    t0 = time.perf_counter()
    history.load(engine, effects=effects, days=30, first=_next_number(engine))
    return time.perf_counter() - t0


def _next_number(engine: Engine) -> int:
    """1 + the highest effect number a loaded month's markers (``b-N``) cover."""
    with engine.connect() as conn:
        last = conn.execute(
            sa.text(
                "SELECT max(CAST(substr(batch_id, 3) AS bigint)) FROM batches"
                " WHERE job = 'billing' AND batch_id ~ '^b-[0-9]+$'"
            )
        ).scalar_one()
    return int(last or 0) * history.PER_BATCH + 1


def _cycle(side: Side, base: str, pid: int, args: argparse.Namespace, c: int) -> dict[str, float]:
    cutoff = _oldest_month(side.engine)
    purger = Purger(side.engine, cutoff, args.batch_size, args.pace)
    started = dt.datetime.now(dt.UTC)
    found: dict[str, float] = {}
    for kind in ("alone", "with") if c % 2 == 0 else ("with", "alone"):
        if kind == "alone":
            found["drain alone /s"] = history_side.drain(side, base, pid, args.burst)[0]
        else:
            rate, overlap = _drain_with_purge(side, base, pid, args.burst, purger)
            found["drain while purging /s"], found["purge overlap"] = rate, overlap
    found["purged effects"] = purger.done.effects
    found["purge effects/s"] = purger.done.effects / max(purger.seconds, 1e-9)
    found["purge working /s"] = purger.done.effects / max(purger.done.seconds, 1e-9)
    found["forgotten keys"] = purger.done.keys
    found["vacuum s"] = _vacuum(side.engine, args.vacuum, started)
    month = args.effects // 12 // 1000 * 1000
    found["fill s"] = _fill(side.engine, month)
    found["size GB"] = _size_bytes(side.engine) / 1e9
    return found


def main(argv: list[str]) -> int:
    args = _parse(argv)
    print(f"start: {uptime()}; purge pace {args.pace:g}", flush=True)
    url = scratch.with_database(history_cluster.server_url(), args.reuse)
    db.upgrade(url)
    engine = db.create_engine(url, pool_size=4)
    side = Side("history", url, engine, args.effects, max(1, args.effects // 5))
    rows: list[dict[str, float]] = []
    try:
        print(f"size before: {_size_bytes(engine) / 1e9:.2f} GB", flush=True)
        with bench_receiver.serve() as (base, pid):
            history_side.prepare(side, base)
            bench_history.prewarm(url)
            for c in range(args.cycles):
                rows.append(_cycle(side, base, pid, args, c))
                print(f"cycle {c + 1}: " + ", ".join(f"{k} {v:,.2f}" for k, v in rows[-1].items()))
    finally:
        engine.dispose()
    names = list(rows[0]) if rows else []
    print(f"\n{'cycle':>5} " + " ".join(f"{n:>22}" for n in names))
    for c, row in enumerate(rows):
        print(f"{c + 1:>5} " + " ".join(f"{row[n]:>22,.2f}" for n in names))
    ratios = [r["drain while purging /s"] / r["drain alone /s"] for r in rows]
    rates = [r["purge effects/s"] for r in rows]
    if rows:
        print(
            f"\ndrain while purging / alone: {', '.join(f'{x:.2f}' for x in ratios)}; median"
            f" {statistics.median(ratios):.2f} (>= 0.9); purge median"
            f" {statistics.median(rates):,.0f} effects/s (>= 50,000); size"
            f" {rows[0]['size GB']:.2f} -> {rows[-1]['size GB']:.2f} GB"
        )
    print(f"end: {uptime()}")
    return 0
