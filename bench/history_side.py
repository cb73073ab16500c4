"""One side of the history bench: a database (empty, or holding a year of history)
and what is measured on it: a drain, commit-to-first-attempt latency, audit
lookups, /v1/status and /metrics, and bytes on disk per finished effect."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import random
import statistics
import threading
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg2
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from bench import contenders, history_wal
from bench.database import dsn
from spark_outbox.api.app import create_app
from spark_outbox.cli.tools import history
from spark_outbox.console import tokens
from spark_outbox.core import counts, db
from spark_outbox.core.endpoints import add_webhook, pause
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store


@dataclasses.dataclass
class Side:
    name: str
    url: str
    engine: Engine
    loaded: int  # history effects, numbered 1..loaded
    recipients: int  # as the history's (a customer has five effects in it); bursts too
    bursts: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (first, n)

    def numbers(self, rng: random.Random) -> int:
        """A random effect of this side: of the history if it has one, else of a burst."""
        if self.loaded:
            return rng.randint(1, self.loaded)
        first, n = rng.choice(self.bursts)
        return rng.randint(first, first + n - 1)


def prepare(side: Side, base: str) -> None:
    """The bench's endpoints at the receiver; the history's own paused: their last
    day's pending effects, due an hour after the load, would otherwise be retried
    against a closed port beside the history side's drains (a cost of due work,
    not of the history), as they were in the runs of 2026-11-27 16:07."""
    with side.engine.begin() as conn:
        for name in history.ENDPOINTS:
            if conn.execute(
                sa.text("SELECT 1 FROM endpoints WHERE name = :n AND enabled"), {"n": name}
            ).first():
                pause(conn, name, "bench history: its receivers are not running")
        for name, path in (("bench", "/hook"), ("lat", "/lat")):
            found = conn.execute(sa.text("SELECT 1 FROM endpoints WHERE name = :n"), {"n": name})
            if found.first() is None:
                add_webhook(conn, name=name, url=f"{base}{path}")
            else:
                conn.execute(
                    sa.text("UPDATE endpoints SET url = :u WHERE name = :n"),
                    {"u": f"{base}{path}", "n": name},
                )


_NUMBERS = int(time.time()) * 1_000_000  # bursts of this run: numbers no run used


def next_first(n: int) -> int:
    global _NUMBERS
    _NUMBERS += n
    return _NUMBERS - n


def _ctx(side: Side, base: str, receiver_pid: int) -> contenders.Ctx:
    return contenders.Ctx(url=side.url, base=base, engine=side.engine, receiver_pid=receiver_pid)


def unfinished(engine: Engine, endpoint: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text(
                    "SELECT EXISTS (SELECT 1 FROM effects WHERE endpoint = :e"
                    " AND state IN ('pending', 'leased'))"
                ),
                {"e": endpoint},
            ).scalar_one()
        )


@contextmanager
def dispatcher(side: Side, base: str, receiver_pid: int) -> Iterator[None]:
    """One ``outbox dispatcher run`` process (its defaults) on this side's database."""
    proc = contenders.start_dispatchers(_ctx(side, base, receiver_pid), 1)
    try:
        yield
    finally:
        contenders.stop_all([proc])


def drain(side: Side, base: str, receiver_pid: int, n: int) -> tuple[float, dict[str, float]]:
    """Deliveries/s of a fresh committed batch of ``n`` effects, commit to last record,
    and what it wrote (``history_wal``)."""
    with dispatcher(side, base, receiver_pid):
        first = next_first(n)
        before = history_wal.counters(side.engine)
        t0 = time.perf_counter()
        history.burst(
            side.engine, effects=n, first=first, endpoint="bench", recipients=side.recipients
        )
        while unfinished(side.engine, "bench"):
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        wrote = history_wal.per_delivery(before, history_wal.counters(side.engine), n)
    side.bursts.append((first, n))
    return n / elapsed, wrote


def latency(side: Side, base: str, receiver_pid: int, rate: float, seconds: float) -> list[float]:
    """Commit-to-first-attempt latencies (ms, sorted): one effect per transaction at a
    steady ``rate`` from 4 producer connections, noted right after each COMMIT."""
    tag = f"lat-{side.name}-{next_first(1)}-"
    committed: dict[str, float] = {}
    start, total = time.perf_counter() + 0.2, int(rate * seconds)
    with dispatcher(side, base, receiver_pid):
        producers = [
            threading.Thread(
                target=_produce, args=(side.url, tag, start, rate, range(p, total, 4), committed)
            )
            for p in range(4)
        ]
        for p in producers:
            p.start()
        for p in producers:
            p.join()
        while unfinished(side.engine, "lat"):
            time.sleep(0.02)
    with urllib.request.urlopen(f"{base}/arrivals", timeout=30) as resp:  # noqa: S310
        arrivals = json.loads(resp.read())
    first: dict[str, float] = {}
    for key, at in arrivals:
        first.setdefault(key, at)
    return sorted((first[k] - committed[k]) * 1000 for k in committed if k in first)


_PRODUCE = (
    "BEGIN; INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
    " VALUES (%s, 'lat', CAST(%s AS jsonb), 'x'); SELECT pg_notify('outbox_effects', 'lat');"
    " COMMIT"
)


def _produce(
    url: str, tag: str, start: float, rate: float, numbers: range, committed: dict[str, float]
) -> None:
    conn = psycopg2.connect(dsn(url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for i in numbers:
                pause = start + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                key = hashlib.sha256(f"{tag}{i}".encode()).hexdigest()
                cur.execute(_PRODUCE, (key, json.dumps({"type": "invoice.created", "n": i})))
                committed[key] = time.time()
    finally:
        conn.close()


def _timed(call: Callable[[int], int], n: int) -> list[float]:
    for i in range(min(50, n)):  # warm-up: pool, plan caches
        call(i)
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        status = call(i)
        samples.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            raise RuntimeError(f"status {status}")
    return sorted(samples)


@contextmanager
def client(side: Side) -> Iterator[tuple[Any, dict[str, str]]]:
    """The real app (token auth included) on this side's database, in process."""
    with side.engine.begin() as conn:
        _, token = tokens.create(conn, name=f"bench-{next_first(1)}", role="support")
    settings = Settings.from_env(database_url=side.url, log_level="WARNING")
    with warnings.catch_warnings():  # Starlette 1.x prefers httpx2 (see pyproject.toml)
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient
    with TestClient(create_app(settings)) as c:
        yield c, {"Authorization": f"Bearer {token}"}


def _window(side: Side, i: int) -> dict[str, str]:
    """31 days around effect ``i``'s creation (the widest search window the API takes):
    support knows roughly when; looked up untimed."""
    with side.engine.connect() as conn:
        at = conn.execute(
            sa.text("SELECT created_at FROM effects WHERE idempotency_key = :k"),
            {"k": history.key_of(i)},
        ).scalar_one()
    return {
        "since": (at - dt.timedelta(days=15)).isoformat(),
        "until": (at + dt.timedelta(days=15)).isoformat(),
    }


Request = tuple[str, dict[str, object]]  # path, query


def _lookups_of(side: Side, i: int) -> dict[str, Request]:
    """Each lookup support makes for effect ``i``, ready to send."""
    window = _window(side, i)
    if i <= side.loaded:
        batch_id = f"b-{(i - 1) // 1000 + 1}"
    else:
        batch_id = f"burst-{next(f for f, n in side.bursts if f <= i < f + n)}"
    recipient = f"customer-{i % side.recipients}@example.com"
    return {
        "GET /v1/effects/{key}": (f"/v1/effects/{history.key_of(i)}", {}),
        "search by recipient": ("/v1/effects", window | {"recipient": recipient}),
        "search by reference": ("/v1/effects", window | {"reference": history.reference_of(i)}),
        "search by batch": ("/v1/effects", {"job": "billing", "batch_id": batch_id}),
    }


def lookups(side: Side, requests: int, seed: int) -> dict[str, list[float]]:
    """Samples (ms, sorted) of each audit lookup a support person makes, about random
    effects of this side (prepared untimed, then sent one after another)."""
    rng = random.Random(seed)
    now = dt.datetime.now(dt.UTC)
    page = {
        "since": (now - dt.timedelta(days=30)).isoformat(),
        "until": now.isoformat(),
        "endpoint": "bench",
        "state": "delivered",
        "limit": 100,
    }
    prepared = [_lookups_of(side, side.numbers(rng)) for _ in range(requests + 50)]
    kinds = [*prepared[0], "search page (filtered)"]
    with client(side) as (c, headers):
        found = {}
        for kind in kinds:
            sent = iter(r.get(kind, ("/v1/effects", page)) for r in prepared)

            def send(_: int) -> int:
                path, query = next(sent)  # noqa: B023 (consumed within this kind's loop)
                return int(c.get(path, params=query, headers=headers).status_code)

            found[kind] = _timed(send, requests)
        return found


def status(side: Side, requests: int) -> dict[str, list[float]]:
    """Samples (ms, sorted) of /v1/status, /metrics and a dispatcher's queue figures."""
    with side.engine.begin() as conn:
        counts.fold(conn)
    with client(side) as (c, headers):
        found = {
            "GET /v1/status": _timed(
                lambda _: int(c.get("/v1/status", headers=headers).status_code), requests
            ),
            "GET /metrics": _timed(lambda _: int(c.get("/metrics").status_code), requests),
        }
    engine = db.create_engine(side.url, pool_size=1, **store.ENGINE_OPTIONS)
    try:

        def queue(_: int) -> int:
            store.queue_stats(engine)
            return 200

        found["dispatcher queue figures"] = _timed(queue, requests)
    finally:
        engine.dispose()
    return found


def p(samples: list[float], q: float) -> float:
    return samples[min(len(samples) - 1, int(len(samples) * q))]


def median(values: list[float]) -> float:
    return statistics.median(values)
