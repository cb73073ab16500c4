"""Audit API latency with a big outbox: p50/p99 of lookup by key, by recipient, by
business reference, and a search page.

Loads ``--effects`` effects (default 1M) with 3 attempts each (3M) into a fresh
database cloned from the migrated test template, using SQL generate_series
(seconds, not minutes), VACUUM ANALYZEs it, then times ``--requests`` requests
of each kind through the real app (create_app, in-process ASGI, real
PostgreSQL, token auth included). Target: p99 ≤ 20 ms.

    python -m bench api -- --effects 50000 --requests 500
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import random
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from spark_outbox.api.app import create_app
from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.bulk import load, recipient_of, reference_of
from spark_outbox.console import tokens
from spark_outbox.core import db
from spark_outbox.core.settings import Settings

TARGET_P99_MS = 20.0


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench api", description=__doc__)
    p.add_argument("--effects", type=int, default=1_000_000)
    p.add_argument("--attempts", type=int, default=3, help="attempts per effect")
    p.add_argument("--requests", type=int, default=2000, help="timed requests per kind")
    p.add_argument("--keep", action="store_true", help="keep the database afterwards")
    return p.parse_args(argv)


def _prepare(server_url: str, n_effects: int, attempts: int) -> str:
    url = scratch.clone_template(server_url, scratch.ensure_template(server_url))
    engine = db.create_engine(url, pool_size=1)
    try:
        started = time.perf_counter()
        with engine.begin() as conn:
            load(conn, effects=n_effects, attempts=attempts)
        loaded = time.perf_counter() - started
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
        print(
            f"loaded {n_effects:,} effects and {n_effects * attempts:,} attempts in "
            f"{loaded:.1f} s (+ VACUUM ANALYZE {time.perf_counter() - started - loaded:.1f} s)"
        )
    finally:
        engine.dispose()
    return url


def _time(call: Callable[[int], int], n: int) -> list[float]:
    for i in range(min(100, n)):  # warm-up: pool, plan caches, page cache
        call(i)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        status = call(i)
        samples.append((time.perf_counter() - started) * 1000)
        assert status == 200, status
    return samples


@dataclasses.dataclass
class Kinds:
    client: Any  # fastapi.testclient.TestClient
    headers: dict[str, str]
    n_effects: int
    since: str
    until: str
    rng: random.Random

    def by_key(self, _: int) -> int:
        i = self.rng.randint(1, self.n_effects)
        key = hashlib.sha256(f"effect-{i}".encode()).hexdigest()
        return self.client.get(f"/v1/effects/{key}", headers=self.headers).status_code

    def by_recipient(self, _: int) -> int:
        params = {"recipient": recipient_of(self.rng.randint(1, self.n_effects), self.n_effects)}
        return self._search(params)

    def by_reference(self, _: int) -> int:
        """What support types when a customer quotes an invoice number."""
        return self._search({"reference": reference_of(self.rng.randint(1, self.n_effects))})

    def search_page(self, _: int) -> int:
        """A support search: one endpoint's dead effects, a 100-row page."""
        return self._search({"endpoint": "billing-webhook", "state": "dead", "limit": 100})

    def status(self, _: int) -> int:
        return self.client.get("/v1/status", headers=self.headers).status_code

    def _search(self, params: dict[str, object]) -> int:
        query = {"since": self.since, "until": self.until, **params}
        return self.client.get("/v1/effects", params=query, headers=self.headers).status_code


def main(argv: list[str]) -> int:
    args = _parse(argv)
    root = Path(__file__).resolve().parents[1]
    server_url = database_url(Settings.from_env(state_dir=root / ".outbox"))
    url = _prepare(server_url, args.effects, args.attempts)
    try:
        engine = db.create_engine(url, pool_size=1)
        with engine.begin() as conn:
            _, token = tokens.create(conn, name="bench", role="support")
        engine.dispose()
        now = dt.datetime.now(dt.UTC)
        settings = Settings.from_env(database_url=url, log_level="WARNING")
        with warnings.catch_warnings():  # Starlette 1.x prefers httpx2 (see pyproject.toml)
            warnings.simplefilter("ignore")
            from fastapi.testclient import TestClient

        with TestClient(create_app(settings)) as client:
            kinds = Kinds(
                client=client,
                headers={"Authorization": f"Bearer {token}"},
                n_effects=args.effects,
                since=(now - dt.timedelta(days=30)).isoformat(),
                until=(now + dt.timedelta(hours=1)).isoformat(),
                rng=random.Random(42),
            )
            print(f"{'request':24} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
            worst = 0.0
            for name, call in (
                ("GET /v1/effects/{key}", kinds.by_key),
                ("search by recipient", kinds.by_recipient),
                ("search by reference", kinds.by_reference),
                ("search page (filtered)", kinds.search_page),
            ):
                samples = sorted(_time(call, args.requests))
                p50 = statistics.median(samples)
                p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
                worst = max(worst, p99)
                print(f"{name:24} {len(samples):6} {p50:8.2f} {p99:8.2f} {samples[-1]:8.2f}")
            status = sorted(_time(kinds.status, max(20, args.requests // 20)))
            print(
                f"{'GET /v1/status':24} {len(status):6} {statistics.median(status):8.2f}"
                f" {'':>8} {status[-1]:8.2f}  (not in the target: a dashboard call)"
            )
        verdict = "met" if worst <= TARGET_P99_MS else "MISSED"
        print(f"target p99 <= {TARGET_P99_MS:.0f} ms: {verdict} (worst p99 {worst:.2f} ms)")
    finally:
        if args.keep:
            print(f"kept database: {db.redact(url)}")
        else:
            scratch.drop_database(server_url, scratch.database_name(url))
    return 0
