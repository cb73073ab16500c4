"""The cost of uncertain sends (docs/dispatcher.md, "Uncertain sends"): the same
deliveries to an endpoint that deduplicates (no start recorded) and to one that
does not (``start_sends``: one durable statement per group of sends, before any
byte goes out), side by side in one run.

    flock /tmp/outbox-bench.lock .venv/bin/python -m bench uncertain
    ... -- [--effects 20000] [--emails 2000] [--rounds 3] [--latency-n 300] [--rate 100]
           [--settle-backlog 100000]

Webhooks: ``outbox dispatcher run --processes 1`` delivers N POSTs to the bench
receiver (bench/receiver.py) from an endpoint with ``deduplicates`` on, then off.
E-mail: the same with N messages to an aiosmtpd server in this process (one SMTP
connection per message, as the channel sends). Rounds interleave (the order
rotates); medians of deliveries/s and CPU µs per delivery. Then latency: effects
committed one per transaction at a steady ``--rate``, p50/p99 of commit -> recorded
(``delivered_at - created_at``, both the server's clock), per endpoint. And the
cost of ``settle_uncertain`` (each dispatcher runs it once per heartbeat) beside
a backlog of pending effects.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from aiosmtpd.controller import Controller

from bench import contenders, cpu
from bench.bench_dispatch import uptime
from bench.database import bench_database, insert_effects, load
from bench.receiver import serve
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core import wakeup
from spark_outbox.core.endpoints import add_email, add_webhook
from spark_outbox.dispatch import store

Runner = Callable[[contenders.Ctx, int], float]

_MAILS = """
INSERT INTO effects (idempotency_key, endpoint, recipient, payload, payload_sha256)
SELECT lpad(to_hex(g), 64, '0'), :endpoint, 'c' || g || '@example.com',
       jsonb_build_object('subject', 'Invoice ' || g, 'text', 'Your invoice ' || g), 'x'
FROM generate_series(1, :n) g
"""


class _Sink:
    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        return "250 OK"


@contextmanager
def smtp_server() -> Iterator[int]:
    port = free_port()
    controller = Controller(_Sink(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


def _endpoints(ctx: contenders.Ctx, smtp_port: int) -> None:
    with ctx.engine.begin() as conn:
        add_webhook(conn, name="bench-no-dedup", url=f"{ctx.base}/hook", deduplicates=False)
        for name, dedup in (("mail-dedup", True), ("mail-no-dedup", False)):
            add_email(
                conn,
                name=name,
                smtp_host="127.0.0.1",
                smtp_port=smtp_port,
                mail_from="bench@example.com",
                deduplicates=dedup,
            )


def _mails(engine: sa.Engine, n: int, endpoint: str) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text(_MAILS), {"n": n, "endpoint": endpoint})
        wakeup.notify(conn, "bench")


def _drain(endpoint: str, insert: Callable[[sa.Engine, int, str], None]) -> Runner:
    def run(ctx: contenders.Ctx, n: int) -> float:
        with ctx.engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger"))
        proc = contenders.start_dispatchers(ctx, 1, "--concurrency", "64")
        try:
            insert(ctx.engine, n, endpoint)
            t0 = time.perf_counter()
            unfinished = "SELECT count(*) FROM effects WHERE state IN ('pending', 'leased')"
            contenders._wait(lambda: contenders._scalar(ctx.engine, unfinished) == 0, 900, "drain")
            elapsed = time.perf_counter() - t0
        finally:
            contenders.stop_all([proc])
        delivered = "SELECT count(*) FROM effects WHERE state = 'delivered'"
        if (got := contenders._scalar(ctx.engine, delivered)) != n:
            raise RuntimeError(f"{got} of {n} delivered to {endpoint}")
        return n / elapsed

    return run


def _webhooks(engine: sa.Engine, n: int, endpoint: str) -> None:
    insert_effects(engine, n, endpoint)


def _throughput(
    ctx: contenders.Ctx, pairs: list[tuple[str, Runner, int]], rounds: int
) -> dict[str, list[tuple[float, cpu.Sample]]]:
    runs: dict[str, list[tuple[float, cpu.Sample]]] = {name: [] for name, _, _ in pairs}
    postmaster = cpu.postmaster_pid()
    for r in range(rounds):
        shift = r % len(pairs)
        for name, run, n in pairs[shift:] + pairs[:shift]:
            before = cpu.sample(ctx.receiver_pid, postmaster)
            rate = run(ctx, n)
            used = cpu.sample(ctx.receiver_pid, postmaster) - before
            runs[name].append((rate, used))
            pg = "-" if used.postgres is None else f"{used.postgres / n * 1e6:.0f}"
            print(
                f"round {r + 1}: {name:32} {rate:8,.0f}/s  CPU us/delivery: dispatcher "
                f"{used.contender / n * 1e6:.0f}, postgres {pg}",
                flush=True,
            )
    return runs


def _latency(ctx: contenders.Ctx, endpoint: str, n: int, rate: float, mail: bool) -> list[float]:
    """Commit -> recorded, in ms (sorted), for ``n`` effects committed at ``rate``/s."""
    with ctx.engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger"))
    proc = contenders.start_dispatchers(ctx, 1)
    one = (
        "INSERT INTO effects (idempotency_key, endpoint, recipient, payload, payload_sha256)"
        " VALUES (lpad(to_hex(:g), 64, '0'), :endpoint, 'c@example.com',"
        " CAST(:payload AS jsonb), 'x')"
    )
    payload = '{"subject": "s", "text": "t"}' if mail else '{"type": "invoice.created"}'
    try:
        start = time.perf_counter()
        for g in range(1, n + 1):
            time.sleep(max(0.0, start + g / rate - time.perf_counter()))
            with ctx.engine.begin() as conn:
                conn.execute(sa.text(one), {"g": g, "endpoint": endpoint, "payload": payload})
                wakeup.notify(conn, "bench")
        unfinished = "SELECT count(*) FROM effects WHERE state IN ('pending', 'leased')"
        contenders._wait(lambda: contenders._scalar(ctx.engine, unfinished) == 0, 120, "drain")
    finally:
        contenders.stop_all([proc])
    with ctx.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT 1000 * EXTRACT(EPOCH FROM delivered_at - created_at) FROM effects"
                " WHERE state = 'delivered' ORDER BY 1"
            )
        ).scalars()
        return [float(x) for x in rows]


def _settle_cost(ctx: contenders.Ctx, backlog: int, calls: int = 50) -> tuple[float, float]:
    """Median ms of ``store.settle_uncertain`` with ``backlog`` pending effects and 64
    leased started sends not expired (what a busy outbox has while it runs), then
    with those 64 expired (the call that settles them)."""
    with ctx.engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger"))
    insert_effects(ctx.engine, backlog, "bench-no-dedup")
    with ctx.engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'leased', lease_token = gen_random_uuid(),"
                " lease_owner = 'bench', send_started_at = now(),"
                " lease_expires_at = now() + interval '1 hour' WHERE id IN"
                " (SELECT id FROM effects ORDER BY id LIMIT 64)"
            )
        )
        conn.execute(sa.text("ANALYZE effects"))
    idle = []
    for _ in range(calls):
        t0 = time.perf_counter()
        assert store.settle_uncertain(ctx.engine) == []
        idle.append((time.perf_counter() - t0) * 1000)
    with ctx.engine.begin() as conn:
        conn.execute(sa.text("UPDATE effects SET lease_expires_at = now() WHERE state = 'leased'"))
    t0 = time.perf_counter()
    settled = store.settle_uncertain(ctx.engine)
    busy = (time.perf_counter() - t0) * 1000
    assert len(settled) == 64
    return statistics.median(idle), busy


def _pct(values: list[float], p: float) -> float:
    return values[min(len(values) - 1, int(p * len(values)))]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench uncertain")
    parser.add_argument("--effects", type=int, default=20000, help="webhooks per run")
    parser.add_argument("--emails", type=int, default=2000, help="e-mails per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-n", type=int, default=300, help="0: skip latency")
    parser.add_argument("--rate", type=float, default=100.0, help="latency: commits per second")
    parser.add_argument("--settle-backlog", type=int, default=100_000, help="0: skip")
    args = parser.parse_args(argv)
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}", flush=True)
    with serve() as (base, receiver_pid), bench_database() as url, smtp_server() as smtp_port:
        engine = load(url, base)
        ctx = contenders.Ctx(url=url, base=base, engine=engine, receiver_pid=receiver_pid)
        try:
            _endpoints(ctx, smtp_port)
            pairs = [
                ("webhook, deduplicates", _drain("bench", _webhooks), args.effects),
                ("webhook, no-deduplicates", _drain("bench-no-dedup", _webhooks), args.effects),
                ("e-mail, deduplicates", _drain("mail-dedup", _mails), args.emails),
                ("e-mail, no-deduplicates", _drain("mail-no-dedup", _mails), args.emails),
            ]
            if args.rounds > 0:
                runs = _throughput(ctx, pairs, args.rounds)
                _report(runs, {name: n for name, _, n in pairs})
            if args.settle_backlog > 0:
                idle_ms, busy_ms = _settle_cost(ctx, args.settle_backlog)
                print(
                    f"\nsettle_uncertain beside {args.settle_backlog:,} pending effects: "
                    f"{idle_ms:.2f} ms a call with nothing to settle (median of 50), "
                    f"{busy_ms:.2f} ms settling 64"
                )
            if args.latency_n > 0:
                print(f"\ncommit -> recorded, {args.latency_n} effects at {args.rate:g}/s:")
                for name, endpoint, mail in (
                    ("webhook, deduplicates", "bench", False),
                    ("webhook, no-deduplicates", "bench-no-dedup", False),
                    ("e-mail, deduplicates", "mail-dedup", True),
                    ("e-mail, no-deduplicates", "mail-no-dedup", True),
                ):
                    ms = _latency(ctx, endpoint, args.latency_n, args.rate, mail)
                    p50, p99 = _pct(ms, 0.5), _pct(ms, 0.99)
                    print(f"| {name:32} | p50 {p50:7.1f} ms | p99 {p99:7.1f} ms |")
        finally:
            engine.dispose()
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}")
    return 0


def _report(runs: dict[str, list[tuple[float, cpu.Sample]]], sizes: dict[str, int]) -> None:
    rounds = len(next(iter(runs.values())))
    print(f"\nmedians of {rounds} interleaved round(s)")
    print(
        f"| {'endpoint':32} | {'median/s':>9} | {'range/s':>17} | {'vs dedup':>8} | "
        f"{'CPU us/delivery dispatcher':>26} | {'postgres':>8} |"
    )
    print(f"|{'-' * 34}|{'-' * 10}:|{'-' * 18}:|{'-' * 9}:|{'-' * 27}:|{'-' * 9}:|")
    med = {name: statistics.median(r for r, _ in v) for name, v in runs.items()}
    for name, values in runs.items():
        n = sizes[name]
        rates = [r for r, _ in values]
        base = med[name.replace("no-deduplicates", "deduplicates")]
        dispatcher_us = statistics.median(u.contender for _, u in values) / n * 1e6
        pg = [u.postgres for _, u in values if u.postgres is not None]
        pg_text = f"{statistics.median(pg) / n * 1e6:.0f}" if pg else "-"
        print(
            f"| {name:32} | {med[name]:9,.0f} | {min(rates):8,.0f}-{max(rates):8,.0f} | "
            f"{med[name] / base:7.2f}x | {dispatcher_us:26.0f} | {pg_text:>8} |"
        )
