"""Dispatcher throughput and latency against a fast local receiver.

    python -m bench dispatch -- [--effects N] [--latency-s S] [--rate R]

Measures, in one run on a fresh database:
1. the receiver's own ceiling under ``wrk`` (installed with apt-get when root
   and missing), POSTing a body like ours with 64 connections;
2. signed webhook deliveries/s with 1 and 4 ``outbox dispatcher run`` processes
   (each: concurrency 64, claims of 100), from the commit of N effects until
   none is pending or leased;
3. p50/p99 commit-to-first-attempt latency at a steady R effects/s (one
   ``enqueue`` + COMMIT each; the producer notes the time after COMMIT, the
   worker notes the attempt's start: same clock).

The receiver is uvicorn (uvloop + httptools) in its own process, answering 200
without verifying (it stands for a fast third party).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2
import sqlalchemy as sa
from sqlalchemy.engine import Engine, make_url

from dispatcher import db, wakeup
from dispatcher.endpoints import add_webhook
from dispatcher.enqueue import enqueue
from dispatcher.settings import Settings
from outbox.database import database_url
from outbox.tools.scratch import free_port

ROOT = Path(__file__).resolve().parents[1]
PAYLOAD_PAD = "x" * 260  # ~320-byte bodies


async def receiver_app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """A minimal ASGI receiver: read the body, answer 200."""
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        more = bool(message.get("more_body"))
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def _wait_port(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@contextmanager
def receiver() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.bench_dispatch:receiver_app",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--loop",
            "uvloop",
            "--http",
            "httptools",
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
    )
    try:
        _wait_port(port)
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        proc.terminate()
        proc.wait(10)


def ensure_wrk() -> str | None:
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("installing wrk with apt-get ...", flush=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=False, capture_output=True)
    return shutil.which("wrk")


def wrk_ceiling(wrk: str, url: str, seconds: int, tmp: Path) -> float:
    script = tmp / "post.lua"
    body = json.dumps({"n": 1, "pad": PAYLOAD_PAD})
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(body)}\n"
        'wrk.headers["Content-Type"] = "application/json"\n'
    )
    out = subprocess.run(
        [wrk, "-t2", "-c64", f"-d{seconds}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("Requests/sec:"))
    return float(line.split()[1])


@contextmanager
def bench_database(settings: Settings) -> Iterator[str]:
    server = database_url(settings)
    name = f"outbox_bench_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(db.libpq_url(db.sqlalchemy_url(server)))
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        url = make_url(db.sqlalchemy_url(server)).set(database=name)
        rendered = url.render_as_string(hide_password=False)
        db.upgrade(rendered)
        yield rendered
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _worker_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return env | {
        "DATABASE_URL": url,
        "OUTBOX_SSRF_ALLOW_NETWORKS": "127.0.0.0/8",
        "OUTBOX_LOG_LEVEL": "WARNING",
        "OUTBOX_POLL_INTERVAL_S": "1",
    }


@contextmanager
def workers(url: str, count: int, concurrency: int) -> Iterator[None]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "outbox",
                "dispatcher",
                "run",
                "--concurrency",
                str(concurrency),
            ],
            cwd=ROOT,
            env=_worker_env(url) | {"OUTBOX_WORKER_ID": f"bench-{count}-{i}"},
        )
        for i in range(count)
    ]
    try:
        _wait_ready(url, [f"bench-{count}-{i}" for i in range(count)])
        yield
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(60)


def bare_client(url: str, n: int, in_flight: int) -> float:
    """The one-process ceiling: aiohttp POSTs with no database, no signing, no log."""
    import asyncio

    import aiohttp

    body = json.dumps({"n": 1, "pad": PAYLOAD_PAD}).encode()

    async def run() -> float:
        limit = asyncio.Semaphore(in_flight)
        connector = aiohttp.TCPConnector(limit=in_flight)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one() -> None:
                async with limit, session.post(url, data=body) as resp:
                    await resp.read()

            t0 = time.perf_counter()
            await asyncio.gather(*(one() for _ in range(n)))
            return n / (time.perf_counter() - t0)

    return asyncio.run(run())


def _wait_ready(url: str, worker_ids: list[str], timeout_s: float = 60) -> None:
    """Workers are ready once their first heartbeat is in (imports take seconds)."""
    conn = psycopg2.connect(db.libpq_url(db.sqlalchemy_url(url)))
    conn.autocommit = True
    deadline = time.monotonic() + timeout_s
    try:
        with conn.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute(
                    "SELECT count(*) FROM worker_heartbeats"
                    " WHERE worker_id = ANY(%s) AND stopped_at IS NULL",
                    (worker_ids,),
                )
                row = cur.fetchone()
                if row is not None and row[0] == len(worker_ids):
                    return
                time.sleep(0.05)
    finally:
        conn.close()
    raise RuntimeError(f"workers {worker_ids} did not start in {timeout_s}s")


def _reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger, worker_heartbeats"))


def _unfinished(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM effects WHERE state IN ('pending', 'leased')")
            ).scalar_one()
        )


def throughput(engine: Engine, url: str, n: int, count: int, concurrency: int) -> float:
    _reset(engine)
    with workers(url, count, concurrency):
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
                    " SELECT lpad(to_hex(g), 64, '0'), 'bench',"
                    " jsonb_build_object('n', g, 'pad', CAST(:pad AS text)), 'x'"
                    " FROM generate_series(1, :n) g"
                ),
                {"n": n, "pad": PAYLOAD_PAD},
            )
            wakeup.notify(conn, "bench")
        t0 = time.perf_counter()
        while _unfinished(engine):
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    with engine.connect() as conn:
        delivered = conn.execute(
            sa.text("SELECT count(*) FROM effects WHERE state = 'delivered'")
        ).scalar_one()
    if delivered != n:
        raise RuntimeError(f"only {delivered} of {n} effects were delivered")
    return n / elapsed


def latency(engine: Engine, url: str, rate: float, seconds: float) -> tuple[float, float, float]:
    _reset(engine)
    committed: dict[str, float] = {}
    with workers(url, 1, 64):
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            due = start + i / rate
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            key = f"{i:064x}"
            with engine.begin() as conn:
                enqueue(
                    conn,
                    idempotency_key=key,
                    endpoint="bench",
                    payload={"n": i, "pad": PAYLOAD_PAD},
                )
            committed[key] = time.time()
            i += 1
        achieved = i / (time.perf_counter() - start)
        while _unfinished(engine):
            time.sleep(0.05)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT e.idempotency_key, EXTRACT(EPOCH FROM min(a.started_at))"
                " FROM effects e JOIN delivery_attempts a ON a.effect_id = e.id"
                " GROUP BY e.idempotency_key"
            )
        ).all()
    lat_ms = sorted((float(first) - committed[key]) * 1000 for key, first in rows)
    p50 = statistics.median(lat_ms)
    p99 = lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))]
    return p50, p99, achieved


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench dispatch")
    parser.add_argument("--effects", type=int, default=30000)
    parser.add_argument("--latency-s", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--wrk-s", type=int, default=10)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    rows: list[tuple[str, str, str]] = []
    with receiver() as hook_url, bench_database(settings) as url:
        engine = db.create_engine(url, pool_size=2)
        try:
            with engine.begin() as conn:
                add_webhook(conn, name="bench", url=hook_url)
            wrk = ensure_wrk()
            ceiling_rps: float | None = None
            if wrk:
                tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-{uuid.uuid4().hex[:8]}"  # noqa: S108
                tmp.mkdir()
                ceiling_rps = wrk_ceiling(wrk, hook_url, args.wrk_s, tmp)
                shutil.rmtree(tmp, ignore_errors=True)
                rows.append(("receiver alone under wrk -c64", f"{ceiling_rps:,.0f} req/s", "1.00"))
            else:
                rows.append(("receiver alone under wrk", "wrk not available", "-"))
            bare = bare_client(hook_url, args.effects, args.concurrency)
            ratio = f"{bare / ceiling_rps:.2f}" if ceiling_rps else "-"
            rows.append(
                (
                    f"bare aiohttp client x {args.concurrency}, no database",
                    f"{bare:,.0f} req/s",
                    ratio,
                )
            )
            for count in (1, 4):
                rps = throughput(engine, url, args.effects, count, args.concurrency)
                ratio = f"{rps / ceiling_rps:.2f}" if ceiling_rps else "-"
                plural = "s" if count > 1 else ""
                label = f"dispatch, {count} worker{plural} x {args.concurrency} in flight"
                rows.append((label, f"{rps:,.0f} deliveries/s ({rps / bare:.0%} of bare)", ratio))
            p50, p99, achieved = latency(engine, url, args.rate, args.latency_s)
            rows.append(
                (
                    f"commit-to-first-attempt, asked {args.rate:.0f}/s, got {achieved:.0f}/s",
                    f"p50 {p50:.1f} ms, p99 {p99:.1f} ms",
                    "-",
                )
            )
        finally:
            engine.dispose()
    print(
        f"\neffects per throughput run: {args.effects}; "
        "signed (Standard Webhooks), every attempt logged"
    )
    print(f"| {'measurement':58} | {'result':38} | ratio to ceiling |")
    print(f"|{'-' * 60}|{'-' * 40}|-----------------:|")
    for label, value, ratio in rows:
        print(f"| {label:58} | {value:38} | {ratio:>16} |")
    return 0
