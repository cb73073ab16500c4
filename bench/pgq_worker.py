"""pgqueuer 1.6 (asyncpg driver) as a contender: each job POSTs its payload.

    python -m bench.pgq_worker DSN URL [--batch-size N]

Runs one QueueManager until SIGTERM, on uvloop like the dispatcher. The job's
payload is the same ~230-byte JSON body the dispatcher sends, POSTed with
aiohttp over one keep-alive pool (64 connections), unsigned and unlogged: what a
plain queue does. Writes ``ready`` to stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import aiohttp
import asyncpg
import uvloop
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager


async def run(dsn: str, url: str, batch_size: int | None) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    @qm.entrypoint("post")
    async def post(job: Job) -> None:
        async with session.post(
            url, data=job.payload, headers={"Content-Type": "application/json"}
        ) as resp:
            await resp.read()
            resp.raise_for_status()

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    loop.call_later(0.5, lambda: print("ready", flush=True))
    try:
        if batch_size is None:
            await qm.run()  # pgqueuer's defaults
        else:
            await qm.run(batch_size=batch_size)
    finally:
        await session.close()
        await conn.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench.pgq_worker")
    p.add_argument("dsn")
    p.add_argument("url")
    p.add_argument("--batch-size", type=int)
    args = p.parse_args(argv)
    uvloop.run(run(args.dsn, args.url, args.batch_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
