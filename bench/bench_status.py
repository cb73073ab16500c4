"""``/v1/status`` and the queue's figures beside a due backlog (issue 30 item 1).

Every status page, API scrape, dispatcher heartbeat and progress line reads the
queue's figures (effects due now and the oldest due age, in all and per
endpoint). Loads ``--due`` due effects (default 1,000,000) of one endpoint into a
fresh database cloned from the migrated template, VACUUM ANALYZEs it, and times,
interleaved round by round (a shuffled order each round, medians and p99):

- ``GET /v1/status`` through the real app (create_app, in-process ASGI, token
  auth), with one "dispatcher" beside it taking the queue's snapshot at its
  heartbeat (``store.queue_stats`` every 5 s on the dispatcher's engine, its calls
  timed too): the deployment's steady state;
- the queue's figures as a status page reads them now (``queue.queue`` once, then
  ``endpoint_state.endpoint_states`` with them, one transaction on the API's engine);
- the same figures as the release before migration 2813 read them: its two
  statements (the due count in all, then per endpoint), JIT off, one
  transaction: what every one of those readers cost before.

    python -m bench status -- --due 1000000 --requests 50
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from bench.payload import PAD
from spark_outbox.api.app import create_app
from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools import scratch
from spark_outbox.console import tokens
from spark_outbox.core import db, endpoint_state, queue
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store

TARGET_MS = 50.0
HEARTBEAT_S = 5.0

# The release before 2813: the queue's figures, counted in full on every read.
_BEFORE = (
    "SELECT set_config('jit', 'off', true)",
    "SELECT count(*) AS depth,"
    " COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at)), 0) AS oldest_due_age_s"
    " FROM ready_effects WHERE next_attempt_at <= now()",
    "SELECT endpoint, count(*) AS depth,"
    " COALESCE(EXTRACT(EPOCH FROM now() - min(next_attempt_at)), 0) AS oldest_due_age_s"
    " FROM ready_effects WHERE next_attempt_at <= now() GROUP BY endpoint",
)
_LOAD = (
    "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, next_attempt_at)"
    " SELECT 'b' || lpad(to_hex(g), 63, '0'), 'bench', jsonb_build_object('type',"
    " 'invoice.created', 'n', g, 'pad', :pad), 'x', now() - interval '1 hour'"
    " FROM generate_series(:lo, :hi) g"
)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench status", description=__doc__)
    p.add_argument("--due", type=int, default=1_000_000, help="due effects of one endpoint")
    p.add_argument("--requests", type=int, default=50, help="timed calls of each kind")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return p.parse_args(argv)


def _prepare(server_url: str, due: int) -> str:
    url = scratch.clone_template(server_url, scratch.ensure_template(server_url))
    engine = db.create_engine(url, pool_size=1)
    try:
        started = time.perf_counter()
        with engine.begin() as conn:
            add_webhook(conn, name="bench", url="http://127.0.0.1:9/hook")
        for lo in range(1, due + 1, 250_000):
            with engine.begin() as conn:
                conn.execute(sa.text(_LOAD), {"lo": lo, "hi": min(due, lo + 249_999), "pad": PAD})
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
        print(f"loaded {due:,} due effects in {time.perf_counter() - started:.1f} s", flush=True)
    finally:
        engine.dispose()
    return url


class Heartbeat(threading.Thread):
    """One dispatcher's heartbeat: the queue's figures every HEARTBEAT_S on the
    dispatcher's engine (the snapshot's refresh when it is due), each call timed."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.engine = db.create_engine(url, pool_size=1, **store.ENGINE_OPTIONS)
        self.stop = threading.Event()
        self.samples: list[float] = []

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.perf_counter()
            store.queue_stats(self.engine, HEARTBEAT_S)
            self.samples.append((time.perf_counter() - started) * 1000)
            self.stop.wait(HEARTBEAT_S)


def _summary(name: str, found: list[float]) -> tuple[float, float]:
    samples = sorted(found)
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    print(f"{name:58} {len(samples):5} {p50:9.2f} {p99:9.2f} {samples[-1]:9.2f}", flush=True)
    return p50, p99


def main(argv: list[str]) -> int:
    args = _parse(argv)
    root = Path(__file__).resolve().parents[1]
    server_url = database_url(Settings.from_env(state_dir=root / ".outbox"))
    url = _prepare(server_url, args.due)
    beat = Heartbeat(url)
    try:
        engine = db.create_engine(url, pool_size=2)
        with engine.begin() as conn:
            _, token = tokens.create(conn, name="bench", role="support")
        settings = Settings.from_env(database_url=url, log_level="WARNING")
        with warnings.catch_warnings():  # Starlette 1.x prefers httpx2 (see pyproject.toml)
            warnings.simplefilter("ignore")
            from fastapi.testclient import TestClient
        beat.start()
        headers = {"Authorization": f"Bearer {token}"}
        with TestClient(create_app(settings)) as client:

            def status() -> None:
                response = client.get("/v1/status", headers=headers)
                assert response.status_code == 200, response.text
                assert response.json()["queue"]["depth"] >= args.due * 0.99

            def now() -> None:
                with engine.begin() as conn:
                    figures = queue.queue(conn)  # status and /metrics read them once
                    assert figures.total.depth >= args.due * 0.99
                    endpoint_state.endpoint_states(conn, figures)

            def before() -> None:
                with engine.begin() as conn:
                    for statement in _BEFORE:
                        conn.execute(sa.text(statement)).all()

            kinds: dict[str, Callable[[], None]] = {
                "GET /v1/status (a dispatcher's heartbeat beside it)": status,
                "the queue's figures now (in all and per endpoint)": now,
                "the queue's figures before 2813 (two full counts)": before,
            }
            samples: dict[str, list[float]] = {name: [] for name in kinds}
            order, rng = list(kinds), random.Random(7)
            for call in kinds.values():
                call()  # warm-up: pool, plan caches, page cache
            for _ in range(args.requests):
                rng.shuffle(order)
                for name in order:
                    started = time.perf_counter()
                    kinds[name]()
                    samples[name].append((time.perf_counter() - started) * 1000)
        beat.stop.set()
        beat.join()
        print(f"beside {args.due:,} due effects, interleaved, {args.requests} rounds:")
        print(f"{'call':58} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
        found = {name: _summary(name, s) for name, s in samples.items()}
        _summary("a dispatcher's heartbeat figures (every 5 s)", beat.samples)
        p50_now = found["the queue's figures now (in all and per endpoint)"][0]
        p50_before = found["the queue's figures before 2813 (two full counts)"][0]
        print(f"the queue's figures, before / now (p50): {p50_before / p50_now:.1f}x")
        p50_status = found["GET /v1/status (a dispatcher's heartbeat beside it)"][0]
        verdict = "met" if p50_status <= TARGET_MS else "MISSED"
        print(f"target /v1/status <= {TARGET_MS:.0f} ms (median): {verdict} ({p50_status:.1f})")
        engine.dispose()
    finally:
        beat.stop.set()
        beat.engine.dispose()
        if args.keep:
            print(f"kept database: {db.redact(url)}")
        else:
            scratch.drop_database(server_url, scratch.database_name(url))
    return 0
