"""The design ceiling: the least a dispatcher with the issue's guarantees can do.

    python -m bench.floor_worker DSN URL [--in-flight 64] [--batch 100]

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
back-off, SMTP. asyncpg (pgqueuer's driver) instead of psycopg2. Writes ``ready`` to stdout once
it listens; runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import signal
import sys
import time

import asyncpg
import uvloop

from dispatcher import signing
from dispatcher.channels.http1 import Client, Failure

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

_RECORD = """
WITH r AS (
    SELECT * FROM unnest(CAST($1 AS bigint[]), CAST($2 AS uuid[]), CAST($3 AS text[]),
                         CAST($4 AS int[]), CAST($5 AS text[]), CAST($6 AS float8[]),
                         CAST($7 AS float8[]), CAST($8 AS int[]))
         AS r(id, token, outcome, status_code, error, started_at, duration_ms, attempt)
), done AS (
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

    async def send(self, row: asyncpg.Record) -> None:
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

    async def claimer(self, conn: asyncpg.Connection) -> None:
        last_expire = time.monotonic()
        while not self.stop.is_set():
            free = self.in_flight - self.sending
            if free < min(self.batch, self.in_flight) // 4:
                self.room.clear()
                await self.room.wait()
                continue
            rows = await conn.fetch(_CLAIM, min(free, self.batch))
            for row in rows:
                self.sending += 1
                asyncio.get_running_loop().create_task(self.send(row))
            if time.monotonic() - last_expire > 5:
                await conn.execute(_EXPIRE)
                last_expire = time.monotonic()
            if not rows:
                self.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.wake.wait(), 0.05)

    async def recorder(self, conn: asyncpg.Connection) -> None:
        while not (self.stop.is_set() and not self.results and not self.sending):
            if not self.results:
                self.have_results.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.have_results.wait(), 0.1)
                continue
            batch, self.results = self.results, []
            columns = list(zip(*batch, strict=True))
            await conn.execute(_RECORD, *columns)


async def run(dsn: str, url: str, in_flight: int, batch: int) -> None:
    # Every statement here is index probes only. asyncpg prepares each statement,
    # and PostgreSQL then keeps a generic plan made on the sizes of its moment: one
    # made while the queue held a few hundred rows hash-joined a scan of all of it
    # on every claim once it held 30,000 (PostgreSQL at ~220 us per delivery instead
    # of ~60). So every call is planned on its own parameters (their planning is
    # counted), and scans that are not index scans are off.
    settings = {
        "plan_cache_mode": "force_custom_plan",
        "enable_sort": "off",
        "enable_bitmapscan": "off",
        "enable_seqscan": "off",
    }
    claim_conn = await asyncpg.connect(
        dsn, server_settings=settings | {"synchronous_commit": "off", "jit": "off"}
    )
    record_conn = await asyncpg.connect(dsn, server_settings=settings | {"jit": "off"})
    floor = Floor(url, in_flight, batch)
    await claim_conn.add_listener("floor", lambda *_: floor.wake.set())
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: (floor.stop.set(), floor.room.set()))
    print("ready", flush=True)
    try:
        await asyncio.gather(floor.claimer(claim_conn), floor.recorder(record_conn))
    finally:
        await floor.client.close()
        await claim_conn.close()
        await record_conn.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench.floor_worker")
    p.add_argument("dsn")
    p.add_argument("url")
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--batch", type=int, default=100)
    args = p.parse_args(argv)
    uvloop.run(run(args.dsn, args.url, args.in_flight, args.batch))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
