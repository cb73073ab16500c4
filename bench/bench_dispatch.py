"""Dispatcher throughput side by side with pgqueuer and a bare client, and latency.

    flock /tmp/outbox-bench.lock .venv/bin/python -m bench dispatch
    ... -- [--effects 30000] [--rounds 3] [--latency-s 30] [--latency-rounds 3] [--rate 1000]
           [--kills 10] [--only NAME ...]
    ... -- --valves   (the claim with the held-batch exclusion vs main's view: bench/valves.py)
    ... -- --latency-s 0 --only settings --settings "--claim-batch-size 200" --settings ""
                      (the dispatcher, 1 process, with each set of options: how defaults are chosen)
    ... -- --latency-s 0 --only settings --settings "" --code /tmp/main --tracing
                      (tracing off, today's code from a checkout, tracing on: its cost)
    ... -- --latency-s 0 --kills 0 --only settings --settings "" --uncounted
                      (the count triggers' cost on the hot path: on, then disabled)

On one fresh database, against one receiver (uvicorn + uvloop + httptools, one
process, bench/receiver.py), every contender delivers the same N POSTs of the
same ~230-byte JSON body, each contender in its own process(es), in
interleaved rounds (the order rotates every round); medians are compared:

- bare aiohttp client, no database, on uvloop and on plain asyncio; the
  dispatcher's own lean HTTP/1.1 client with nothing around it, on uvloop (the
  fastest client this machine runs: the one-process ceiling);
- pgqueuer 1.6 (asyncpg driver) with its defaults, with batch_size=100, and
  with batch_size=100 in 2 processes (bench/pgq_worker.py);
- the design ceiling (bench/floor_worker.py), in 1 and 2 processes: only what a
  dispatcher with the issue's guarantees must do per delivery (a fenced lease, a
  ledger probe, a signed POST, a durable record: queue row deleted, key ledger
  row, attempt row), each the cheapest way this machine runs it, on a narrow
  queue table; and the same with each job's wide ``effects`` row updated once
  when delivered (leases kept out of the effect row): how far a design could go;
- ``outbox dispatcher run`` with 1 process, and with ``--processes`` at its
  default (one per core): signed (Standard Webhooks), every attempt logged;
  with 1 process also against an endpoint with limits that never bind (a rate
  limit and max_in_flight far above the machine: the shared budget's bookkeeping
  on the hot path) and against an ordered endpoint (the 30,000 effects over 1,000
  ordering keys, round robin: 30 per key, sent strictly in order per key).

The limits' and ordering's costs: ``... -- --only "processes 1" --latency-s 0``.

A queue contender's time runs from the commit of its N jobs to the moment none
is left unfinished in the database. Then p50/p99 commit-to-arrival latency at a
steady rate (one ``enqueue`` + COMMIT each; the producer notes the time after
COMMIT, the receiver notes each arrival: same host clock), with 1 process and the
default, in interleaved rounds; the medians of each round's p50 and p99. Then the
crash window (bench/crash.py): ``--kills`` times ``kill -9`` of ``outbox dispatcher
run`` at its defaults mid-drain of N webhooks (re-sends per kill), then of N/10
e-mails to an endpoint that cannot deduplicate (uncertain effects per kill).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from bench import contenders, cpu, crash, valves
from bench.bench_dispatch_explain import explained
from bench.database import bench_database, load
from bench.receiver import serve

ROOT = contenders.ROOT


@dataclass(frozen=True)
class Contender:
    name: str
    kind: str  # bare | pgqueuer | floor | dispatch
    run: Callable[[contenders.Ctx, int], float]


VALVES = [
    Contender("dispatcher 1 process, main's claimable view", "dispatch",
              valves.claim_with(valves.MAIN_VIEW)),
    Contender("dispatcher 1 process, held-batch exclusion", "dispatch",
              valves.claim_with(valves.VALVE_VIEW)),
    Contender("  same, held rows not parked (not built)", "dispatch",
              valves.claim_with(valves.VALVE_VIEW, parked=False)),
]  # fmt: skip

CONTENDERS = [
    Contender("bare aiohttp, uvloop", "bare", contenders.bare("uvloop")),
    Contender("bare aiohttp, plain asyncio", "bare", contenders.bare("asyncio")),
    # The dispatcher's own HTTP/1.1 client (dispatch/channels/http1.py), nothing around it.
    Contender("bare lean client, uvloop", "bare", contenders.bare("uvloop", "lean")),
    Contender("pgqueuer, defaults", "pgqueuer", contenders.pgqueuer(None, 1)),
    Contender("pgqueuer, batch_size=100", "pgqueuer", contenders.pgqueuer(100, 1)),
    Contender("pgqueuer, batch_size=100, 2 processes", "pgqueuer", contenders.pgqueuer(100, 2)),
    # The design ceiling: only what a dispatcher must keep, each the cheapest way
    # (bench/floor_worker.py); how far any design could go on this machine.
    Contender("design ceiling, 1 process", "floor", contenders.floor(1)),
    Contender("design ceiling, 2 processes", "floor", contenders.floor(2)),
    Contender("design ceiling + effects row, 1 process", "floor", contenders.floor(1, True)),
    Contender("design ceiling + effects row, 2 processes", "floor", contenders.floor(2, True)),
    # The same on the product's own driver (psycopg2 in threads): what the driver costs.
    Contender(
        "design ceiling + effects, psycopg2, 1 process",
        "floor",
        contenders.floor(1, True, "psycopg2"),
    ),
    Contender("dispatcher, --processes 1", "dispatch", contenders.dispatcher(1)),
    Contender(
        "dispatcher, --processes 1, limits on",
        "dispatch",
        contenders.dispatcher(1, "bench-limited"),
    ),
    Contender(
        "dispatcher, --processes 1, ordered (1000 keys)",
        "dispatch",
        contenders.dispatcher(1, "bench-ordered", 1000),
    ),
    Contender(
        f"dispatcher, --processes default ({contenders.cores()})",
        "dispatch",
        contenders.dispatcher(0),
    ),
]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


Runs = dict[str, list[tuple[float, cpu.Sample]]]


def throughput(
    ctx: contenders.Ctx, n: int, rounds: int, names: list[str], pool: list[Contender] | None = None
) -> Runs:
    """Each chosen contender once per round (the order rotates): rate and CPU seconds."""
    pool = CONTENDERS if pool is None else pool
    chosen = [c for c in pool if not names or any(x in c.name for x in names)]
    runs: Runs = {c.name: [] for c in chosen}
    postmaster = cpu.postmaster_pid()
    for r in range(rounds):
        shift = r % len(chosen)
        for c in chosen[shift:] + chosen[:shift]:
            before = cpu.sample(ctx.receiver_pid, postmaster)
            rate = c.run(ctx, n)
            used = cpu.sample(ctx.receiver_pid, postmaster) - before
            runs[c.name].append((rate, used))
            print(f"round {r + 1}: {c.name:45} {rate:9,.0f}/s  {_cpu_text(used, n)}", flush=True)
    return runs


def _cpu_text(used: cpu.Sample, n: int) -> str:
    pg = "-" if used.postgres is None else f"{used.postgres / n * 1e6:.0f}"
    return (
        f"CPU us/delivery: contender {used.contender / n * 1e6:.0f}, postgres {pg}, "
        f"receiver {used.receiver / n * 1e6:.0f}"
    )


def report(runs: Runs, n: int, rounds: int) -> None:
    rates = {name: [rate for rate, _ in v] for name, v in runs.items()}
    med = {name: statistics.median(v) for name, v in rates.items()}
    kinds = {c.name: c.kind for c in CONTENDERS + VALVES}
    pgq = [m for name, m in med.items() if kinds[name] == "pgqueuer"]
    best_pgq = max(pgq) if pgq else None
    bare = [m for name, m in med.items() if kinds[name] == "bare"]
    ceiling = max(bare) if bare else None  # the fastest bare client of this run
    print(f"\n{n:,} POSTs of a ~230-byte JSON body, median of {rounds} interleaved round(s);")
    print("PostgreSQL's CPU microseconds per delivery beside the rate (median over rounds)")
    print(
        f"| {'contender':45} | {'median/s':>9} | {'range/s':>15} | {'PG us':>5} | "
        f"{'vs pgqueuer best':>16} | {'vs best bare':>14} |"
    )
    print(f"|{'-' * 47}|{'-' * 11}:|{'-' * 17}:|{'-' * 7}:|{'-' * 18}:|{'-' * 16}:|")
    for name, values in rates.items():
        m = med[name]
        spread = f"{min(values):,.0f}-{max(values):,.0f}"
        vs_pgq = f"{m / best_pgq:.2f}x" if best_pgq else "-"
        vs_bare = f"{m / ceiling:.2f}x" if ceiling else "-"
        pg = _pg_us(runs[name], n)
        print(f"| {name:45} | {m:9,.0f} | {spread:>15} | {pg:>5} | {vs_pgq:>16} | {vs_bare:>14} |")
    _paired(runs, kinds)
    _settings_paired(runs)
    _ordered_paired(runs)
    print("\nCPU microseconds per delivery (median over rounds): contender processes, PostgreSQL,")
    print("the receiver; from /proc, so they hold up on a loaded machine better than rates do.")
    print("A contender's CPU includes its processes' start-up (each ~0.5 s of imports, ~16 us a")
    print("delivery over 30,000): one process per worker, plus the dispatcher's supervisor.")
    heads = f"{'contender':>9} | {'postgres':>8} | {'receiver':>8} | {'total':>6}"
    print(f"| {'contender':45} | {heads} |")
    print(f"|{'-' * 47}|{'-' * 10}:|{'-' * 9}:|{'-' * 9}:|{'-' * 7}:|")
    for name, v in runs.items():
        us = [
            statistics.median(getattr(s, side) or 0.0 for _, s in v) / n * 1e6
            for side in ("contender", "postgres", "receiver")
        ]
        # An outside database (DATABASE_URL set): its CPU cannot be read here.
        known = all(s.postgres is not None for _, s in v)
        pg, total = (f"{us[1]:.0f}", f"{sum(us):.0f}") if known else ("-", "-")
        print(f"| {name:45} | {us[0]:9.0f} | {pg:>8} | {us[2]:8.0f} | {total:>6} |")


def _pg_us(values: list[tuple[float, cpu.Sample]], n: int) -> str:
    """PostgreSQL's CPU µs per delivery, the median over rounds ('-' when the database
    is outside: DATABASE_URL set)."""
    pg = [s.postgres for _, s in values]
    if any(p is None for p in pg):
        return "-"
    return f"{statistics.median(p for p in pg if p is not None) / n * 1e6:.0f}"


def _paired(runs: Runs, kinds: dict[str, str]) -> None:
    """Each contender against the best pgqueuer of the same round, then the median:
    a round's contenders run minutes apart at most, so a slow phase of the machine
    that moves every rate moves both sides of these ratios (medians of whole runs
    pair a fast round of one with a slow round of the other)."""
    pgq = [name for name in runs if kinds[name] == "pgqueuer"]
    others = [name for name in runs if kinds[name] in ("floor", "dispatch")]
    if not pgq or not others:
        return
    rounds = min(len(v) for v in runs.values())
    best = [max(runs[name][r][0] for name in pgq) for r in range(rounds)]
    _per_round(runs, others, best, "that round's best pgqueuer")


def _settings_paired(runs: Runs) -> None:
    """``--settings`` contenders against the first of them, round by round."""
    chosen = [name for name in runs if ", settings: " in name]
    if len(chosen) < 2:
        return
    first = [rate for rate, _ in runs[chosen[0]]]
    _per_round(runs, chosen[1:], first, repr(chosen[0]))


def _ordered_paired(runs: Runs) -> None:
    """The ordered contenders against the unordered one (one process each), round by
    round: issue 31 asks for >= 0.8 in every round, not in the median."""
    plain = "dispatcher, --processes 1"
    ordered = [name for name in runs if name.startswith(plain) and "ordered" in name]
    if plain not in runs or not ordered:
        return
    _per_round(runs, ordered, [rate for rate, _ in runs[plain]], repr(plain))


def _per_round(runs: Runs, names: list[str], base: list[float], what: str) -> None:
    """Each of ``names`` against ``base`` (a rate per round), round by round, then the median."""
    print(f"\nPer round, against {what} (then the median):")
    for name in names:
        ratios = [rate / b for (rate, _), b in zip(runs[name], base, strict=False)]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"| {name:45} | {statistics.median(ratios):5.2f}x | {each} |")


def _valve_ratio(runs: Runs) -> None:
    """Within each round, exclusion / main (the machine is shared): their median."""
    main, valve = (runs[c.name] for c in VALVES[:2])
    ratios = [v[0] / m[0] for m, v in zip(main, valve, strict=True)]
    print(f"\nheld-batch exclusion / main's view, per round: {[round(r, 2) for r in ratios]}")
    print(f"median ratio: {statistics.median(ratios):.2f}")


def latency(
    ctx: contenders.Ctx,
    rate: float,
    seconds: float,
    rounds: int,
    backlog: int = 0,
    codes: Sequence[str] = (),
) -> None:
    """p50/p99 commit-to-arrival, with one worker process and with the default (and
    the default of each checkout in ``codes``), in interleaved rounds (the machine is
    noisy: one run can be off by 2x); medians. ``backlog``: with that many older
    effects of another endpoint due meanwhile. Each line also says commit-to-send-start
    (the first attempt's start): the wait before a sender, apart from the send."""
    variants = [("1", 1, ""), (f"default ({contenders.cores()})", 0, "")]
    variants += [(f"default, code {c}", 0, c) for c in codes]
    results: dict[str, list[tuple[float, float]]] = {}
    drained: dict[str, list[float]] = {}  # the backlog's deliveries/s meanwhile, per round
    under = f" beside {backlog:,} older effects due elsewhere" if backlog else ""
    for r in range(rounds):
        for label, processes, code in variants if r % 2 == 0 else variants[::-1]:
            lat_ms, achieved, failed = contenders.latency(
                ctx, rate, seconds, processes, backlog=backlog, code=code or contenders.ROOT
            )
            p50, p99 = _p50_p99(lat_ms)
            s50, s99 = _p50_p99(contenders.LAST_SEND_STARTS or [float("nan")])
            results.setdefault(label, []).append((p50, p99))
            if contenders.LAST_BACKLOG_RATE:
                drained.setdefault(label, []).append(contenders.LAST_BACKLOG_RATE[0])
            print(
                f"round {r + 1}: commit-to-arrival{under}, dispatcher --processes {label}: asked "
                f"{rate:,.0f}/s, got {achieved:,.0f}/s, {len(lat_ms):,} effects: p50 {p50:.1f} ms, "
                f"p99 {p99:.1f} ms, max {lat_ms[-1]:.1f} ms (commit-to-send-start p50 "
                f"{s50:.1f} ms, p99 {s99:.1f} ms); attempts not delivered: {failed}"
                + (
                    f"; the backlog drained {drained[label][-1]:,.0f}/s meanwhile"
                    if backlog
                    else ""
                ),
                flush=True,
            )
    for label, runs in results.items():
        p50s, p99s = [p for p, _ in runs], [p for _, p in runs]
        print(
            f"\ncommit-to-arrival at {rate:,.0f}/s{under}, dispatcher --processes {label}, "
            f"median of {len(runs)} round(s): p50 {statistics.median(p50s):.1f} ms "
            f"({', '.join(f'{p:.1f}' for p in p50s)}), p99 {statistics.median(p99s):.1f} ms "
            f"({', '.join(f'{p:.1f}' for p in p99s)})"
            + (
                f"; the backlog drained {statistics.median(drained[label]):,.0f}/s meanwhile"
                if drained.get(label)
                else ""
            )
        )


def _p50_p99(sorted_ms: list[float]) -> tuple[float, float]:
    return statistics.median(sorted_ms), sorted_ms[
        min(len(sorted_ms) - 1, int(len(sorted_ms) * 0.99))
    ]


def _added(
    settings: list[str],
    code: list[str],
    tracing: bool,
    uncounted: bool = False,
    row_unpark: bool = False,
) -> list[Contender]:
    """The ``--settings``, ``--code`` and ``--tracing`` contenders, all named as
    settings: they are compared with the first of them, round by round."""
    added = [
        Contender(f"dispatcher, 1 process, settings: {options or '(defaults)'}", "dispatch",
                  contenders.dispatcher(1, options=options))
        for options in settings
    ] + [
        Contender(f"dispatcher, 1 process, settings: code of {path}", "dispatch",
                  contenders.dispatcher(1, code=path))
        for path in code
    ]  # fmt: skip
    if tracing:
        name = "dispatcher, 1 process, settings: tracing on (OTLP)"
        added.append(Contender(name, "dispatch", contenders.dispatcher(1, traced=True)))
    if uncounted:
        name = "dispatcher, 1 process, settings: count triggers disabled"
        added.append(Contender(name, "dispatch", contenders.dispatcher(1, counted=False)))
    if row_unpark:
        name = "dispatcher, --processes 1, ordered, row unpark"
        run = contenders.dispatcher(1, "bench-ordered", 1000, row_unpark=True)
        added.append(Contender(name, "dispatch", run))
    return added


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench dispatch")
    parser.add_argument("--effects", type=int, default=30000)
    parser.add_argument("--rounds", type=int, default=3, help="0: latency only")
    parser.add_argument("--latency-s", type=float, default=30.0, help="0: skip")
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument(
        "--backlog",
        type=int,
        default=1_000_000,
        help="latency again, with this many older effects of another endpoint due; 0: skip",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="finished effects loaded before the backlog's latency rounds (e.g. 10000000)",
    )
    parser.add_argument(
        "--stale-statistics",
        action="store_true",
        help="with --history: autovacuum off for effects during the backlog's rounds, so the"
        " statistics stay those of the history alone (a backlog ANALYZE has not seen yet:"
        " autovacuum waits for 10%% of the table to change), the same for every contender",
    )
    parser.add_argument(
        "--vacuum-every",
        type=float,
        default=0.0,
        help="with --backlog: VACUUM effects every this many seconds during its rounds (what"
        " the claims walk when the dead versions a drain leaves are removed early); 0: only"
        " autovacuum",
    )
    parser.add_argument(
        "--backlog-rate",
        type=float,
        default=0.0,
        help="with --backlog: the backlog's endpoint rate-limited to this many sends/s during"
        " its rounds (a drain that leaves the cores headroom: what the fresh effects' latency"
        " is when the machine is not saturated); 0: no limit",
    )
    parser.add_argument(
        "--kills",
        type=int,
        default=10,
        help="the crash window (bench/crash.py): re-sends and uncertain e-mails per kill -9 of"
        " the dispatcher at its defaults over this many kills; 0: skip",
    )
    parser.add_argument(
        "--latency-code",
        action="append",
        default=[],
        metavar="PATH",
        help="the latency rounds also run the dispatcher (default processes) of the checkout at"
        " PATH, interleaved (e.g. `git archive main` unpacked: before and after a change)",
    )
    parser.add_argument(
        "--auto-explain-ms",
        type=int,
        default=0,
        help="run on a private cluster with auto_explain: plans of statements slower than this"
        " go to its log (bench/bench_dispatch_explain.py); 0: off",
    )
    parser.add_argument("--only", nargs="*", default=[], help="contenders whose name has this")
    parser.add_argument(
        "--valves", action="store_true", help="held-batch exclusion vs main's view, no latency"
    )
    parser.add_argument(
        "--settings",
        action="append",
        default=[],
        metavar="OPTIONS",
        help="add a contender: the dispatcher, 1 process, with these `dispatcher run` options"
        ' (repeat to compare several; "" is the defaults)',
    )
    parser.add_argument(
        "--code",
        action="append",
        default=[],
        metavar="PATH",
        help="add a contender: the dispatcher of the checkout at PATH, 1 process, defaults "
        "(e.g. `git archive main` unpacked: today's code against this schema)",
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="add a contender: the dispatcher, 1 process, defaults, tracing on (OTLP/HTTP to "
        "a collector stand-in on loopback; every effect created in a trace)",
    )
    parser.add_argument(
        "--uncounted",
        action="store_true",
        help="add a contender: the dispatcher, 1 process, defaults, with the triggers that keep"
        " effect_counts and attempt_counts disabled (their cost on the record path)",
    )
    parser.add_argument(
        "--row-unpark",
        action="store_true",
        help="add a contender: the ordered one with the unpark trigger as it was before"
        " migration 2810 (one row at a time; bench/row_unpark.py)",
    )
    args = parser.parse_args(argv)
    added = _added(args.settings, args.code, args.tracing, args.uncounted, args.row_unpark)
    CONTENDERS.extend(added)
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}", flush=True)
    with contextlib.ExitStack() as stack:
        if args.auto_explain_ms > 0:
            log_file = stack.enter_context(explained(args.auto_explain_ms))
            print(f"auto_explain > {args.auto_explain_ms} ms: plans in {log_file}", flush=True)
        _bench(args)
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}; cores {os.cpu_count()}")
    return 0


def _bench(args: argparse.Namespace) -> None:
    # The fresh effects' endpoint (``lat``) has a receiver of its own: another
    # customer's server. Sharing the backlog's, a fresh effect queued there behind the
    # backlog's 128-256 requests in flight: a wait no dispatcher can shorten.
    with serve() as (base, receiver_pid), serve() as (lat_base, _), bench_database() as url:
        engine = load(url, base, lat_base)
        ctx = contenders.Ctx(url=url, base=base, engine=engine, receiver_pid=receiver_pid,
                             lat_base=lat_base)  # fmt: skip
        try:
            if args.rounds > 0:
                pool = VALVES if args.valves else CONTENDERS
                runs = throughput(ctx, args.effects, args.rounds, args.only, pool)
                report(runs, args.effects, args.rounds)
                if args.valves:
                    _valve_ratio(runs)
            if args.latency_s > 0 and not args.valves:
                codes = args.latency_code
                latency(ctx, args.rate, args.latency_s, args.latency_rounds, codes=codes)
                if args.backlog > 0:
                    if args.history > 0:
                        contenders._reset(ctx.engine)
                        t0 = time.perf_counter()
                        contenders.load_history(ctx.engine, args.history)
                        took = time.perf_counter() - t0
                        print(f"\nloaded a history of {args.history:,} delivered effects in "
                              f"{took:.0f} s", flush=True)  # fmt: skip
                    rounds = args.latency_rounds
                    with (
                        _stale_statistics(ctx.engine, args.stale_statistics),
                        _backlog_rate(ctx.engine, args.backlog_rate),
                        _vacuum_every(ctx.engine, args.vacuum_every),
                    ):
                        latency(ctx, args.rate, args.latency_s, rounds, args.backlog, codes)
            if args.kills > 0 and not args.valves:
                print(flush=True)
                crash.run(ctx, args.kills, args.effects, args.effects // 10)
        finally:
            engine.dispose()


@contextlib.contextmanager
def _vacuum_every(engine: sa.Engine, every_s: float) -> Iterator[None]:
    """``every_s`` > 0: a thread runs ``VACUUM effects`` every ``every_s`` meanwhile, and
    prints how many ran and how long each took (median)."""
    if every_s <= 0:
        yield
        return
    stop, took = threading.Event(), []

    def run() -> None:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            while not stop.wait(every_s):
                started = time.perf_counter()
                conn.execute(sa.text("VACUUM effects"))
                took.append(time.perf_counter() - started)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        median = statistics.median(took) if took else 0.0
        print(f"VACUUM effects every {every_s:g} s: {len(took)} runs, {median:.2f} s each (median)")


@contextlib.contextmanager
def _backlog_rate(engine: sa.Engine, per_s: float) -> Iterator[None]:
    """``per_s`` > 0: the backlog's endpoint (``bench``) rate-limited meanwhile (the
    limit every dispatcher shares, endpoint_budgets), unlimited again after."""
    if per_s <= 0:
        yield
        return
    print(f"\nthe backlog's endpoint limited to {per_s:,.0f} sends/s", flush=True)
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE endpoints SET rate_limit_per_s = :r WHERE name = 'bench'"), {"r": per_s}
        )
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE endpoints SET rate_limit_per_s = NULL WHERE name = 'bench'")
            )


@contextlib.contextmanager
def _stale_statistics(engine: sa.Engine, on: bool) -> Iterator[None]:
    """``on``: no autovacuum of ``effects`` meanwhile (its statistics stay as they are;
    set back after)."""
    if not on:
        yield
        return
    print("\nstatistics of effects kept stale: autovacuum off for it", flush=True)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE effects SET (autovacuum_enabled = false)"))
    try:
        yield
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE effects RESET (autovacuum_enabled)"))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
