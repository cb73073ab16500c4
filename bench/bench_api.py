"""Audit API latency with a big outbox: p50/p99 of lookup by key, by a key's printed
start, by recipient and by business reference (in a 30-day window, and at any age),
a filtered search page and a work state's list at any age.

Loads ``--effects`` effects (default 1M) with 3 attempts each (3M) into a fresh
database cloned from the migrated test template, using SQL generate_series
(seconds, not minutes), VACUUM ANALYZEs it, then times ``--requests`` requests
of each kind through the real app (create_app, in-process ASGI, real
PostgreSQL, token auth included), the kinds interleaved round by round (one of
each per round, in a shuffled order), so a noisy minute on this shared machine
weighs on every kind alike. ``GET /healthz`` (no database) runs in the same
rounds: the app's own floor. Target: p99 ≤ 20 ms.

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
FLOOR = "floor: GET /healthz (no db)"


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
        samples.append(_once(call, i))
    return samples


def _once(call: Callable[[int], int], i: int) -> float:
    started = time.perf_counter()
    status = call(i)
    elapsed = (time.perf_counter() - started) * 1000
    assert status == 200, status
    return elapsed


def _interleaved(
    kinds: dict[str, Callable[[int], int]], n: int, rng: random.Random
) -> dict[str, list[float]]:
    """``n`` rounds, each calling every kind once in a shuffled order (after a warm-up
    round of 100 each): the kinds share the machine's noisy minutes alike."""
    for call in kinds.values():
        for i in range(min(100, n)):
            call(i)
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    order = list(kinds)
    for i in range(n):
        rng.shuffle(order)
        for name in order:
            samples[name].append(_once(kinds[name], i))
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

    def by_key_prefix(self, _: int) -> int:
        """A key as a report prints it: its first 12 hex characters and an ellipsis."""
        i = self.rng.randint(1, self.n_effects)
        prefix = hashlib.sha256(f"effect-{i}".encode()).hexdigest()[:12] + "…"
        return self._any_age({"key_prefix": prefix})

    def by_recipient_any_age(self, _: int) -> int:
        recipient = recipient_of(self.rng.randint(1, self.n_effects), self.n_effects)
        return self._any_age({"recipient": recipient})

    def by_reference_any_age(self, _: int) -> int:
        return self._any_age({"reference": reference_of(self.rng.randint(1, self.n_effects))})

    def search_page(self, _: int) -> int:
        """A support search: one endpoint's dead effects, a 100-row page."""
        return self._search({"endpoint": "billing-webhook", "state": "dead", "limit": 100})

    def dead_any_age(self, _: int) -> int:
        """The overview's dead tile, as the API serves it: a 100-row page, any age."""
        return self._any_age({"state": "dead", "endpoint": "billing-webhook", "limit": 100})

    def healthz(self, _: int) -> int:
        """The app's floor: routing, middleware and the test client, no database."""
        return int(self.client.get("/healthz").status_code)

    def status(self, _: int) -> int:
        return self.client.get("/v1/status", headers=self.headers).status_code

    def _search(self, params: dict[str, object]) -> int:
        return self._any_age({"since": self.since, "until": self.until, **params})

    def _any_age(self, params: dict[str, object]) -> int:
        response = self.client.get("/v1/effects", params=params, headers=self.headers)
        assert response.status_code != 200 or response.json()["items"], params  # found it
        return int(response.status_code)


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
            timed = {
                "GET /v1/effects/{key}": kinds.by_key,
                "key prefix (12 hex), any age": kinds.by_key_prefix,
                "recipient, 30-day window": kinds.by_recipient,
                "recipient, any age": kinds.by_recipient_any_age,
                "reference, 30-day window": kinds.by_reference,
                "reference, any age": kinds.by_reference_any_age,
                "dead of an endpoint, 30 d": kinds.search_page,
                "dead of an endpoint, any age": kinds.dead_any_age,
            }
            rounds = _interleaved(timed | {FLOOR: kinds.healthz}, args.requests, kinds.rng)
            print(f"{'request':32} {'n':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
            worst = 0.0
            for name, found in rounds.items():
                samples = sorted(found)
                p50 = statistics.median(samples)
                p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
                worst = max(worst, p99) if name != FLOOR else worst
                print(f"{name:32} {len(samples):6} {p50:8.2f} {p99:8.2f} {samples[-1]:8.2f}")
            status = sorted(_time(kinds.status, max(20, args.requests // 20)))
            print(
                f"{'GET /v1/status':32} {len(status):6} {statistics.median(status):8.2f}"
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
