"""History at scale: the same measurements on an empty outbox and beside a year of
history, side by side in one run.

    python -m bench history -- [--effects 10000000] [--burst 30000] [--rounds 3]
                               [--reuse DATABASE] [--keep] [--cold]
                               [--wal-compression {off,pglz,lz4,zstd}]

The history (``spark_outbox.cli.tools.history``: markers, effects, attempts, the
key ledger, rejects) is loaded in SQL into a database of the bench's own cluster
(``bench/history_cluster.py``: sized like a database server; ``DATABASE_URL``
overrides), then VACUUM (FREEZE, ANALYZE)d, as a year-old table would be. 10M
effects take ~40 min here and ~22 GB: ``--keep`` keeps the database,
``--reuse NAME`` measures one kept before (migrated to head first), and drop it
when done (``DROP DATABASE``). Beside it, a fresh database at the same head.

Per round (the side going first alternates), on each side:
1. a drain: a committed batch of ``--burst`` effects delivered by one
   ``outbox dispatcher run`` process (its defaults) to a local receiver, and what
   it wrote per delivery (``history_wal``: WAL, full-page images, buffers the
   backends wrote themselves; ``--wal-compression`` tries a setting for the run);
2. commit-to-first-attempt latency at ``--rate`` effects/s for ``--seconds``;
3. audit lookups through the real app: by key, recipient, reference, batch and
   a filtered page (``--requests`` each; the history's effects on that side, the
   bursts' on the empty one);
4. ``/v1/status``, ``/metrics`` and a dispatcher's queue figures.
Before the rounds, the key indexes are read into the page cache (``prewarm``;
``--cold`` does not: then the drain beside history reads them from disk).
Then medians, the history/empty ratios, and bytes on disk per finished effect.
Targets (issue 30): drain >= 0.9x; audit p99 <= 20 ms; /v1/status <= 50 ms.
"""

from __future__ import annotations

import argparse
import collections
import time
import uuid

import sqlalchemy as sa

from bench import history_cluster, history_side, history_wal
from bench import receiver as bench_receiver
from bench.bench_dispatch import uptime
from bench.history_side import Side, median, p
from spark_outbox.cli.tools import history, scratch
from spark_outbox.core import counts, db

TARGET_RATIO, TARGET_AUDIT_P99_MS, TARGET_STATUS_MS = 0.9, 20.0, 50.0


def _parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench history", description=__doc__)
    ap.add_argument("--effects", type=int, default=10_000_000, help="history (default 10M)")
    ap.add_argument("--burst", type=int, default=30_000, help="effects per drain")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=500.0, help="latency: effects/s")
    ap.add_argument("--seconds", type=float, default=10.0, help="latency: how long")
    ap.add_argument("--requests", type=int, default=300, help="per lookup kind and round")
    ap.add_argument("--reuse", metavar="DATABASE", help="a history database kept before")
    ap.add_argument("--keep", action="store_true", help="keep the history database")
    ap.add_argument("--cold", action="store_true", help="measure without warming the keys")
    ap.add_argument(
        "--wal-compression",
        choices=history_wal.WAL_COMPRESSION,
        help="set wal_compression on the bench's cluster for the run (default: as it is)",
    )
    return ap.parse_args(argv)


def _history(server: str, args: argparse.Namespace) -> str:
    if args.reuse:
        url = scratch.with_database(server, args.reuse)
        db.upgrade(url)
        return url
    url = scratch.create_database(server, f"outbox_history_{uuid.uuid4().hex[:8]}")
    db.upgrade(url)
    engine = db.create_engine(url, pool_size=2)
    try:
        t0 = time.perf_counter()
        history.load(engine, effects=args.effects)
        loaded = time.perf_counter() - t0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM (FREEZE, ANALYZE)"))
        print(
            f"loaded {args.effects:,} effects in {loaded:.0f} s, "
            f"VACUUM (FREEZE, ANALYZE) {time.perf_counter() - t0 - loaded:.0f} s",
            flush=True,
        )
    finally:
        engine.dispose()
    return url


# What a fresh effect reads at a random place whatever the history's age: its key in
# the effects' unique index (the enqueue, and again at the record's new row version)
# and in the key ledger (the claim's look-up, the record's insert). Every other index
# a burst touches grows at its right edge, which stays in memory by itself.
KEY_INDEXES = ("uq_effects_idempotency_key", "pk_key_ledger")


def prewarm(database_url: str) -> None:
    """Read the key indexes into the OS page cache (``pg_prewarm``, mode ``read``),
    as a database serving every day has them: a cluster just started (or a cache
    another tenant emptied) reads them from disk, a random page per effect, and
    that is what ``--cold`` measures. Needs the bench cluster's superuser."""
    admin = history_cluster.admin_url(scratch.database_name(database_url))
    if admin is None:
        print("prewarm: skipped (DATABASE_URL: no superuser)", flush=True)
        return
    engine = db.create_engine(admin, pool_size=1)
    try:
        t0 = time.perf_counter()
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE EXTENSION IF NOT EXISTS pg_prewarm"))
            pages = sum(
                conn.execute(sa.text("SELECT pg_prewarm(:i, 'read')"), {"i": i}).scalar_one()
                for i in KEY_INDEXES
            )
        print(
            f"prewarm: {pages * 8 / 1024:,.0f} MB of key indexes read in"
            f" {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    finally:
        engine.dispose()


_SIZES = sa.text("""
SELECT COALESCE(t.relname, c.relname) AS tab, c.relkind = 'i' AS index,
       sum(pg_relation_size(c.oid)) AS bytes
FROM pg_class c
LEFT JOIN pg_index i ON i.indexrelid = c.oid
LEFT JOIN pg_class t ON t.oid = COALESCE(i.indrelid,
    (SELECT r.oid FROM pg_class r WHERE r.reltoastrelid = c.oid))
WHERE c.relnamespace IN ('public'::regnamespace, 'pg_toast'::regnamespace)
  AND COALESCE(t.relnamespace, c.relnamespace) = 'public'::regnamespace
  AND c.relkind IN ('r', 'i', 't')
GROUP BY 1, 2
""")


def bytes_per_finished_effect(side: Side) -> dict[str, float]:
    """Bytes on disk (heap and TOAST, indexes) per finished effect, by table."""
    with side.engine.connect() as conn:
        finished = sum(
            n for s, n in counts.by_state(conn).items() if s in ("delivered", "dead", "cancelled")
        )
        rows = conn.execute(_SIZES).all()
    found: dict[str, float] = collections.defaultdict(float)
    for table, index, size in rows:
        found[f"{table} {'indexes' if index else 'heap'}"] += float(size) / max(1, finished)
    return dict(found)


def _round(
    sides: list[Side], base: str, pid: int, args: argparse.Namespace, r: int
) -> dict[tuple[str, str], list[float]]:
    found: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for side in sides if r % 2 == 0 else sides[::-1]:
        rate, wrote = history_side.drain(side, base, pid, args.burst)
        for what, value in wrote.items():
            found[(side.name, what)].append(value)
        lat = history_side.latency(side, base, pid, args.rate, args.seconds)
        found[(side.name, "drain deliveries/s")].append(rate)
        found[(side.name, "latency p50 ms")].append(p(lat, 0.5))
        found[(side.name, "latency p99 ms")].append(p(lat, 0.99))
        looked = history_side.lookups(side, args.requests, seed=r)
        looked |= history_side.status(side, max(20, args.requests // 10))
        for kind, samples in looked.items():
            found[(side.name, f"{kind} p50 ms")].append(p(samples, 0.5))
            found[(side.name, f"{kind} p99 ms")].append(p(samples, 0.99))
        print(
            f"round {r + 1} {side.name:8} drain {rate:8,.0f}/s  latency p50 {p(lat, 0.5):.1f}"
            f" p99 {p(lat, 0.99):.1f} ms  status p50 {p(looked['GET /v1/status'], 0.5):.1f} ms"
            f"  WAL {wrote['drain WAL bytes/delivery']:,.0f} B/delivery",
            flush=True,
        )
    return found


def _report(found: dict[tuple[str, str], list[float]], sides: list[Side]) -> None:
    empty, full = sides
    print(f"\n{'measurement':42} {'empty':>10} {'history':>10} {'ratio':>7}")
    for (name, what), values in sorted(found.items(), key=lambda kv: kv[0][1]):
        if name != empty.name:
            continue
        e, h = median(values), median(found[(full.name, what)])
        ratio = f"{h / e:7.2f}" if e else f"{'-':>7}"
        print(f"{what:42} {e:10,.1f} {h:10,.1f} {ratio}")
    drain = [median(found[(s.name, "drain deliveries/s")]) for s in sides]
    audit = max(
        median(v)
        for (n, w), v in found.items()
        if n == full.name and w.endswith("p99 ms") and ("search" in w or "{key}" in w)
    )
    status = median(found[(full.name, "GET /v1/status p50 ms")])
    print(
        f"\ntargets: drain {drain[1] / drain[0]:.2f}x (>= {TARGET_RATIO}); worst audit p99"
        f" {audit:.1f} ms (<= {TARGET_AUDIT_P99_MS:.0f}); /v1/status median {status:.1f} ms"
        f" (<= {TARGET_STATUS_MS:.0f})"
    )
    print(f"\n{'bytes on disk per finished effect':40} {'empty':>10} {'history':>10}")
    sizes = [bytes_per_finished_effect(s) for s in sides]
    for part in sorted(set(sizes[0]) | set(sizes[1])):
        row = [s.get(part, 0.0) for s in sizes]
        if max(row) >= 1:
            print(f"{part:40} {row[0]:10,.0f} {row[1]:10,.0f}")
    print(f"{'total':40} {sum(sizes[0].values()):10,.0f} {sum(sizes[1].values()):10,.0f}")


def main(argv: list[str]) -> int:
    args = _parse(argv)
    print(f"start: {uptime()}", flush=True)
    server = history_cluster.server_url()
    history_url = _history(server, args)
    empty_name = f"outbox_empty_{uuid.uuid4().hex[:8]}"
    empty_url = scratch.create_database(server, empty_name)
    sides: list[Side] = []
    try:
        db.upgrade(empty_url)
        recipients = max(1, args.effects // 5)
        for name, url, loaded in (("empty", empty_url, 0), ("history", history_url, args.effects)):
            engine = db.create_engine(url, pool_size=4)
            sides.append(Side(name, url, engine, loaded, recipients))
        found: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
        with (
            history_wal.wal_compression(empty_name, args.wal_compression),
            bench_receiver.serve() as (base, pid),
        ):
            for side in sides:
                history_side.prepare(side, base)
                if not args.cold:
                    prewarm(side.url)
            for r in range(args.rounds):
                for key, values in _round(sides, base, pid, args, r).items():
                    found[key] += values
        _report(found, sides)
    finally:
        for side in sides:
            side.engine.dispose()
        scratch.drop_database(server, empty_name)
        if not (args.keep or args.reuse):
            scratch.drop_database(server, scratch.database_name(history_url))
        elif not args.reuse:
            print(f"kept: --reuse {scratch.database_name(history_url)}")
        print(f"end: {uptime()}")
    return 0
