"""Store calls from asyncio: run in a small thread pool, retried while PostgreSQL is away.

tenacity guards every call: a restarted PostgreSQL (connection refused, "the
database system is starting up", a connection killed mid-statement) must not
kill the worker. A dead pooled connection fails its call, which invalidates it;
``db.translated`` turns that into ``DatabaseUnavailable`` and the retry checks
out a fresh connection (so the dispatcher's engine needs no pre-ping round trip
per call).
Every store statement is one transaction, so a retried call is either the
first to apply or finds its leases already settled (then it records 'stale').
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy.engine import Engine
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_delay,
    stop_never,
    wait_exponential,
    wait_random,
)

from spark_outbox.core import db
from spark_outbox.core.errors import DatabaseUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


def _log_retry(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome else None
    log.warning(
        "database unavailable; retrying",
        extra={"event": "db.retry", "retry": state.attempt_number, "error": str(exc)[:200]},
    )


class DbCalls:
    def __init__(self, engine: Engine, threads: int = 4) -> None:
        self._engine = engine
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="outbox-db")

    async def call(
        self,
        fn: Callable[..., T],
        *args: Any,
        until: asyncio.Event | None = None,
        give_up_after_s: float | None = None,
    ) -> T | None:
        """``fn(engine, *args)`` in a thread; None when ``until`` is set while retrying."""
        loop = asyncio.get_running_loop()
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(DatabaseUnavailable),
            wait=wait_exponential(multiplier=0.1, max=2.0) + wait_random(0, 0.1),
            stop=stop_never if give_up_after_s is None else stop_after_delay(give_up_after_s),
            before_sleep=_log_retry,
            reraise=True,
        )
        async for retry_call in retrying:
            with retry_call:
                if (
                    until is not None
                    and until.is_set()
                    and retry_call.retry_state.attempt_number > 1
                ):
                    return None
                return await loop.run_in_executor(
                    self._executor, functools.partial(_translated, fn, self._engine, *args)
                )
        return None  # pragma: no cover - AsyncRetrying either returns or raises

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _translated(fn: Callable[..., T], engine: Engine, *args: Any) -> T:
    with db.translated():
        return fn(engine, *args)
