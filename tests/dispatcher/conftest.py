"""Dispatcher fixtures: a real, scriptable HTTP receiver on loopback, a real SMTP
server (aiosmtpd), and helpers to run a worker in-process until idle."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from sqlalchemy.engine import Engine

from spark_outbox.core.settings import Settings
from spark_outbox.dispatch.worker import Worker
from tests.otlp import otlp, untraced  # noqa: F401  (tracing to a receiver, or off)


@dataclasses.dataclass
class Reply:
    status: int = 200
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    delay_s: float = 0.0
    body: str = "ok"


@dataclasses.dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


class Receiver:
    """An aiohttp server in its own thread; each path answers from a script
    (the last reply repeats) and every request is kept."""

    def __init__(self) -> None:
        self.requests: list[Seen] = []
        # Requests being answered right now, and the most at once, per path.
        self.in_flight: dict[str, int] = {}
        self.most_in_flight: dict[str, int] = {}
        self._scripts: dict[str, list[Reply]] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.port = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def script(self, path: str, *replies: Reply | int) -> None:
        with self._lock:
            self._scripts[path] = [r if isinstance(r, Reply) else Reply(r) for r in replies]

    def seen(self, path: str | None = None) -> list[Seen]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    def keys(self, path: str | None = None) -> list[str]:
        return [r.headers["webhook-id"] for r in self.seen(path)]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        at = time.time()  # when the request's head arrived (its body may still be coming)
        body = await request.read()
        with self._lock:
            self.requests.append(
                Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, body, at)
            )
            script = self._scripts.get(request.path, [Reply()])
            reply = script.pop(0) if len(script) > 1 else script[0]
            now = self.in_flight[request.path] = self.in_flight.get(request.path, 0) + 1
            most = self.most_in_flight.get(request.path, 0)
            self.most_in_flight[request.path] = max(most, now)
        try:
            if reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            return web.Response(status=reply.status, headers=reply.headers, text=reply.body)
        finally:
            with self._lock:
                self.in_flight[request.path] -= 1

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """Settings with short timers so tests take fractions of a second."""
    return dataclasses.replace(
        settings,
        worker_id="test-worker",
        concurrency=16,
        lease_s=5.0,
        poll_interval_s=0.1,
        heartbeat_interval_s=0.5,
        shutdown_timeout_s=5.0,
        retry_schedule_s=(0.0, 0.2, 0.2),
        retry_after_cap_s=5.0,
    )


def run_worker(settings: Settings, engine: Engine, timeout_s: float = 30.0, **kw: Any) -> int:
    """Run one worker in this process until nothing is due within 3 s (retries included)."""
    kw.setdefault("idle_within_s", 3.0)

    async def main() -> int:
        worker = Worker(settings, engine, database_url=settings.database_url, until_idle=True, **kw)
        return await asyncio.wait_for(worker.run(), timeout_s)

    return asyncio.run(main())
