"""The design ceiling: the least a dispatcher with the issue's guarantees can do.

    python -m bench.floor_worker DSN URL [--in-flight 64] [--batch 100]
                                         [--driver asyncpg|psycopg2]

Not the product: a bench contender that keeps only what a dispatcher must keep
on the hot path, each done the cheapest way this machine runs it, to show how
far any design could go here:

- a lease per claimed job, fenced by a token (``FOR UPDATE SKIP LOCKED`` on a
  narrow queue table of its own, two indexes), claims committed asynchronously;
- the key ledger probed at claim time (a delivered key is not sent again);
- each POST signed (Standard Webhooks HMAC, the dispatcher's own ``signing``)
  and sent with the dispatcher's lean HTTP/1.1 client on uvloop;
- one durable record per batch: the delivered job leaves the queue (DELETE,
  fenced by its token), its key enters the ledger, its attempt gets a row.

With ``effects`` (bench/contenders.py, ``floor``) each job also has its row in
the outbox's own ``effects`` table (the wide row the API audits, with all its
indexes), written at enqueue and updated once, by the record, to 'delivered':
what a dispatcher whose leases live in a narrow table of their own would pay.
Without it the audit row is left out (it would be written at enqueue, outside
the timed part).

Left out, which the dispatcher has: endpoints and their settings, limits,
ordering, holds, uncertain sends, heartbeats, logs and metrics, retries'
back-off, SMTP. asyncpg (pgqueuer's driver) by default; ``--driver psycopg2``
runs the product's own driver, each connection in a thread, as the dispatcher
does. Writes ``ready`` to stdout once it listens; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import signal
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import asyncpg
import psycopg2
import uvloop

from spark_outbox.dispatch import signing
from spark_outbox.dispatch.channels.http1 import Client, Failure

SCHEMA = """
CREATE TABLE IF NOT EXISTS floor_queue (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    effect_id bigint,
    idempotency_key text NOT NULL,
    payload text NOT NULL,
    attempt int NOT NULL DEFAULT 0,
    lease_token uuid,
    leased_until timestamptz
);
CREATE INDEX IF NOT EXISTS floor_queue_due ON floor_queue (id) WHERE lease_token IS NULL;
CREATE TABLE IF NOT EXISTS floor_ledger (
    idempotency_key text PRIMARY KEY,
    delivered_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS floor_attempts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id bigint NOT NULL,
    attempt int NOT NULL,
    lease_token uuid,
    started_at timestamptz NOT NULL,
    duration_ms float8 NOT NULL,
    outcome text NOT NULL,
    status_code int,
    error text
);
CREATE INDEX IF NOT EXISTS floor_attempts_job ON floor_attempts (job_id, attempt);
"""

_CLAIM = """
WITH c AS (
    SELECT id FROM floor_queue WHERE lease_token IS NULL ORDER BY id LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE floor_queue q SET lease_token = gen_random_uuid(),
                         leased_until = now() + interval '30 seconds',
                         attempt = q.attempt + 1
FROM c WHERE q.id = c.id
RETURNING q.id, q.idempotency_key, q.payload, CAST(q.lease_token AS text), q.attempt,
          -- a scalar subquery, one probe of the ledger's key per row: an EXISTS was
          -- planned as a hash of the whole ledger on every claim (O(ledger) a claim)
          (SELECT l.delivered_at FROM floor_ledger l
           WHERE l.idempotency_key = q.idempotency_key) IS NOT NULL
"""

# The record's batch: eight typed arrays (asyncpg sends them in binary), or one
# jsonb array of arrays (psycopg2, as the dispatcher's record does).
_R_ARRAYS = """
WITH r AS (
    SELECT * FROM unnest(CAST($1 AS bigint[]), CAST($2 AS uuid[]), CAST($3 AS text[]),
                         CAST($4 AS int[]), CAST($5 AS text[]), CAST($6 AS float8[]),
                         CAST($7 AS float8[]), CAST($8 AS int[]))
         AS r(id, token, outcome, status_code, error, started_at, duration_ms, attempt)
"""
_R_JSON = """
WITH r AS (
    SELECT CAST(j->>0 AS bigint) AS id, CAST(j->>1 AS uuid) AS token, j->>2 AS outcome,
           CAST(j->>3 AS int) AS status_code, j->>4 AS error,
           CAST(j->>5 AS float8) AS started_at, CAST(j->>6 AS float8) AS duration_ms,
           CAST(j->>7 AS int) AS attempt
    FROM jsonb_array_elements(CAST(%s AS jsonb)) AS j
"""
_RECORD_REST = """), done AS (
    DELETE FROM floor_queue q USING r
    WHERE q.id = r.id AND q.lease_token = r.token AND r.outcome = 'delivered'
    RETURNING q.id, q.idempotency_key, q.effect_id
), audited AS (
    UPDATE effects e SET state = 'delivered', delivered_at = now(), updated_at = now(),
                         attempt_count = e.attempt_count + 1
    FROM done WHERE e.id = done.effect_id
), retried AS (
    UPDATE floor_queue q SET lease_token = NULL, leased_until = NULL FROM r
    WHERE q.id = r.id AND q.lease_token = r.token AND r.outcome <> 'delivered'
    RETURNING q.id
), ledger AS (
    INSERT INTO floor_ledger SELECT idempotency_key, now() FROM done
    ON CONFLICT (idempotency_key) DO NOTHING
)
INSERT INTO floor_attempts (job_id, attempt, lease_token, started_at, duration_ms, outcome,
                            status_code, error)
SELECT r.id, r.attempt, r.token, to_timestamp(r.started_at), r.duration_ms,
       CASE WHEN r.id IN (SELECT id FROM done UNION ALL SELECT id FROM retried)
            THEN r.outcome ELSE 'stale' END,
       r.status_code, r.error
FROM r
"""

_RECORD = _R_ARRAYS + _RECORD_REST
_RECORD_JSON = _R_JSON + _RECORD_REST

# Expired leases (a worker that died mid-send) become due again.
_EXPIRE = "UPDATE floor_queue SET lease_token = NULL WHERE leased_until < now()"

SECRET = b"bench-floor-secret-0123456789abcdef"


class Floor:
    def __init__(self, url: str, in_flight: int, batch: int) -> None:
        self.in_flight = in_flight
        self.batch = batch
        self.client = Client(in_flight, [ipaddress.ip_network("127.0.0.0/8")], None)
        self.target = self.client.target(url)
        self.results: list[tuple[object, ...]] = []
        self.have_results = asyncio.Event()
        self.room = asyncio.Event()
        self.wake = asyncio.Event()
        self.sending = 0
        self.stop = asyncio.Event()

    async def send(self, row: Sequence[Any]) -> None:
        job_id, key, payload, token, attempt, already = row
        started = time.time()
        t0 = time.perf_counter()
        if already:
            outcome, status, error = "delivered", None, "already delivered (key ledger)"
        else:
            body = payload.encode()
            headers = signing.headers([SECRET], key, int(started), body)
            try:
                answer = await self.client.post(self.target, headers.items(), body, 10.0)
                status, error = answer.status, None
                outcome = "delivered" if 200 <= answer.status < 300 else "retry"
            except Failure as failure:
                outcome, status, error = "retry", None, failure.kind
        ms = (time.perf_counter() - t0) * 1000
        self.results.append((job_id, token, outcome, status, error, started, ms, attempt))
        self.have_results.set()
        self.sending -= 1
        self.room.set()

    async def claimer(self, db: Db) -> None:
        last_expire = time.monotonic()
        while not self.stop.is_set():
            free = self.in_flight - self.sending
            if free < min(self.batch, self.in_flight) // 4:
                self.room.clear()
                await self.room.wait()
                continue
            rows = await db.claim(min(free, self.batch))
            for row in rows:
                self.sending += 1
                asyncio.get_running_loop().create_task(self.send(row))
            if time.monotonic() - last_expire > 5:
                await db.expire()
                last_expire = time.monotonic()
            if not rows:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.05)

    async def recorder(self, db: Db) -> None:
        while not (self.stop.is_set() and not self.results and not self.sending):
            if not self.results:
                self.have_results.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.have_results.wait(), 0.1)
                continue
            batch, self.results = self.results, []
            await db.record(batch)


# Every statement here is index probes only, planned on each call's own
# parameters (their planning is counted). asyncpg prepares each statement, and
# PostgreSQL then kept a generic plan made on the sizes of its moment: one made
# while the queue held a few hundred rows hash-joined a scan of all of it on
# every claim once it held 30,000 (PostgreSQL at ~220 us per delivery instead of
# ~60). So custom plans are forced, and scans that are not index scans are off.
SETTINGS = {
    "plan_cache_mode": "force_custom_plan",
    "enable_sort": "off",
    "enable_bitmapscan": "off",
    "enable_seqscan": "off",
    "jit": "off",
}


class Db(Protocol):
    async def claim(self, limit: int) -> Sequence[Sequence[Any]]: ...
    async def record(self, batch: list[tuple[Any, ...]]) -> None: ...
    async def expire(self) -> None: ...
    async def close(self) -> None: ...


class AsyncpgDb:
    """asyncpg (pgqueuer's driver): binary protocol, on the event loop."""

    @classmethod
    async def connect(cls, dsn: str, wake: asyncio.Event) -> AsyncpgDb:
        self = cls()
        self.claims = await asyncpg.connect(
            dsn, server_settings=SETTINGS | {"synchronous_commit": "off"}
        )
        self.records = await asyncpg.connect(dsn, server_settings=SETTINGS)
        await self.claims.add_listener("floor", lambda *_: wake.set())
        return self

    async def claim(self, limit: int) -> Sequence[Sequence[Any]]:
        return await self.claims.fetch(_CLAIM, limit)

    async def record(self, batch: list[tuple[Any, ...]]) -> None:
        await self.records.execute(_RECORD, *zip(*batch, strict=True))

    async def expire(self) -> None:
        await self.claims.execute(_EXPIRE)

    async def close(self) -> None:
        await self.claims.close()
        await self.records.close()


class Psycopg2Db:
    """psycopg2 (the product's driver), each connection in a thread of its own, the
    batch as one jsonb string (as the dispatcher sends its record). No LISTEN: an
    empty claim waits 50 ms before the next, as the claimer does anyway."""

    @classmethod
    async def connect(cls, dsn: str, wake: asyncio.Event) -> Psycopg2Db:
        self = cls()
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="floor-db")
        self.claims = psycopg2.connect(dsn)
        self.records = psycopg2.connect(dsn)
        for conn, extra in ((self.claims, {"synchronous_commit": "off"}), (self.records, {})):
            conn.autocommit = True
            with conn.cursor() as cur:
                for name, value in (SETTINGS | extra).items():
                    cur.execute(f"SET {name} = {value}")
        self.claim_sql = _CLAIM.replace("$1", "%s")
        return self

    async def _run(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn)

    def _fetch(self, conn: Any, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []

    async def claim(self, limit: int) -> Sequence[Sequence[Any]]:
        rows: list[tuple[Any, ...]] = await self._run(
            lambda: self._fetch(self.claims, self.claim_sql, (limit,))
        )
        return rows

    async def record(self, batch: list[tuple[Any, ...]]) -> None:
        rows = json.dumps([list(r) for r in batch])
        await self._run(lambda: self._fetch(self.records, _RECORD_JSON, (rows,)))

    async def expire(self) -> None:
        await self._run(lambda: self._fetch(self.claims, _EXPIRE, ()))

    async def close(self) -> None:
        self.pool.shutdown()
        self.claims.close()
        self.records.close()


async def run(dsn: str, url: str, in_flight: int, batch: int, driver: str) -> None:
    floor = Floor(url, in_flight, batch)
    kind = AsyncpgDb if driver == "asyncpg" else Psycopg2Db
    db: Db = await kind.connect(dsn, floor.wake)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: (floor.stop.set(), floor.room.set()))
    print("ready", flush=True)
    try:
        await asyncio.gather(floor.claimer(db), floor.recorder(db))
    finally:
        await floor.client.close()
        await db.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench.floor_worker")
    p.add_argument("dsn")
    p.add_argument("url")
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--driver", choices=["asyncpg", "psycopg2"], default="asyncpg")
    args = p.parse_args(argv)
    uvloop.run(run(args.dsn, args.url, args.in_flight, args.batch, args.driver))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
