"""The one-process ceiling: POSTs with no database, no signing, no log.

    python -m bench.bare_client URL N [--in-flight 64] [--loop uvloop|asyncio]
                                      [--client aiohttp|lean]

``lean`` is the dispatcher's own HTTP/1.1 client (dispatcher/dispatch/channels/http1.py)
with nothing around it. Prints the rate (requests/s) as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import sys
import time

import aiohttp

from bench.payload import body
from spark_outbox.dispatch.channels.http1 import Client


async def run(url: str, n: int, in_flight: int) -> float:
    data = body(0)
    limit = asyncio.Semaphore(in_flight)
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with limit, session.post(url, data=data) as resp:
                await resp.read()

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        return n / (time.perf_counter() - t0)


async def run_lean(url: str, n: int, in_flight: int) -> float:
    data = body(0)
    limit = asyncio.Semaphore(in_flight)
    client = Client(in_flight, [ipaddress.ip_network("127.0.0.0/8")], None)
    target = client.target(url)
    headers = [("Content-Type", "application/json")]

    async def one() -> None:
        async with limit:
            answer = await client.post(target, headers, data, 30.0)
            assert answer.status == 200, answer.status

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    rate = n / (time.perf_counter() - t0)
    await client.close()
    return rate


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench.bare_client")
    p.add_argument("url")
    p.add_argument("n", type=int)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--client", choices=["aiohttp", "lean"], default="aiohttp")
    args = p.parse_args(argv)
    coro = (run_lean if args.client == "lean" else run)(args.url, args.n, args.in_flight)
    if args.loop == "uvloop":
        import uvloop

        rate = uvloop.run(coro)
    else:
        rate = asyncio.run(coro)
    print(f"{rate:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
