"""The claim with a limited endpoint's backlog beside a free endpoint's effects.

    flock /tmp/outbox-bench.lock .venv/bin/python -m bench claim
    ... -- [--backlog 100000] [--claims 50] [--rounds 5]

Databases side by side: in one, an endpoint with a rate limit has
``--backlog`` effects due (all older than anything else) and no tokens left; in
the other it has none. In both, a free endpoint has effects due. Each round
times ``--claims`` claims of 100 in each database (interleaved, the order
alternating), then hands the leases back. The claim takes each endpoint's share
from its own range of ``ix_effects_due`` and skips an endpoint without budget,
so the backlog should cost (almost) nothing: the ratio says how much. A third
database holds the same backlog on an ordered endpoint, all of one ordering key,
waiting behind its first effect (leased): the ordering rule's worst case, where
every claim that visits that endpoint walks the waiting effects.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import ExitStack

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench.bench_dispatch import uptime
from bench.database import bench_database
from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.dispatch import store

FREE = 20_000


def _load(url: str, backlog: int, ordered: bool = False) -> Engine:
    """A free endpoint's FREE effects beside ``backlog`` older ones of a limited
    endpoint (or, ``ordered``, of an ordered endpoint: one ordering key's effects
    waiting behind its first, which is leased)."""
    engine = db.create_engine(url, **store.ENGINE_OPTIONS)
    with engine.begin() as conn:
        add_webhook(conn, name="limited", url="http://127.0.0.1:9/l", rate_limit_per_s=1.0)
        add_webhook(conn, name="ordered", url="http://127.0.0.1:9/o", ordered=True)
        add_webhook(conn, name="free", url="http://127.0.0.1:9/f")
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256,"
                " next_attempt_at, ordering_key, state, lease_token)"
                " SELECT lpad(to_hex(g), 64, '0'), :endpoint, '{}', 'x',"
                " now() - interval '1 day' + make_interval(secs => g),"
                " CASE WHEN :ordered THEN 'customer-1' END,"
                " CASE WHEN :ordered AND g = 1 THEN 'leased' ELSE 'pending' END,"
                " CASE WHEN :ordered AND g = 1 THEN gen_random_uuid() END"
                " FROM generate_series(1, :n) g"
            ),
            {"n": backlog, "endpoint": "ordered" if ordered else "limited", "ordered": ordered},
        )
        if ordered:  # the head's lease runs for a day: everything behind it waits
            conn.execute(
                sa.text(
                    "UPDATE effects SET next_attempt_at = now() + interval '1 day'"
                    " WHERE state = 'leased'"
                )
            )
        conn.execute(
            sa.text(
                "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                " SELECT 'e' || lpad(to_hex(g), 63, '0'), 'free', '{}', 'x'"
                " FROM generate_series(1, :n) g"
            ),
            {"n": FREE},
        )
        conn.execute(sa.text("ANALYZE effects"))
    return engine


def _no_tokens(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE endpoint_budgets SET tokens = 0, refilled_at = now()"))


def _time_claims(engine: Engine, claims: int) -> list[float]:
    """Milliseconds per claim of 100; then every lease is handed back."""
    _no_tokens(engine)  # a rate of 1/s: at most one more token per second
    took, leases = [], []
    for _ in range(claims):
        t0 = time.perf_counter()
        got = store.claim(engine, "bench", 100, 300)
        took.append((time.perf_counter() - t0) * 1000)
        leases += [store.Release(c.id, c.lease_token) for c in got]
    store.release(engine, leases)
    return took


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench claim")
    parser.add_argument("--backlog", type=int, default=100_000)
    parser.add_argument("--claims", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}", flush=True)
    with ExitStack() as stack:
        engines = {
            f"limited backlog {args.backlog:,}": _load(
                stack.enter_context(bench_database()), args.backlog
            ),
            "no limited backlog": _load(stack.enter_context(bench_database()), 0),
            f"ordered: {args.backlog:,} behind one leased head": _load(
                stack.enter_context(bench_database()), args.backlog, ordered=True
            ),
        }
        times: dict[str, list[float]] = {name: [] for name in engines}
        for r in range(args.rounds):
            shift = r % len(engines)
            order = list(engines)[shift:] + list(engines)[:shift]
            for name in order:
                times[name] += _time_claims(engines[name], args.claims)
        for engine in engines.values():
            engine.dispose()
    base = statistics.median(times["no limited backlog"])
    print(f"\nclaims of 100 ({args.rounds} rounds x {args.claims}, interleaved), {FREE:,} free due")
    print("| database | median ms | p90 ms | ratio |")
    print("|---|---:|---:|---:|")
    for name, values in times.items():
        values.sort()
        p90 = values[int(len(values) * 0.9)]
        med = statistics.median(values)
        print(f"| {name} | {med:.2f} | {p90:.2f} | {med / base:.2f}x |")
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}")
    return 0
