"""How each contender is started, fed N jobs and timed (bench_dispatch runs them)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import psycopg2
import sqlalchemy as sa
from pgqueuer import AsyncpgDriver, Queries
from sqlalchemy.engine import Engine

from bench import floor_worker, otlp_sink
from bench.database import dsn, insert_effects
from bench.payload import PAD, body, document

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Ctx:
    url: str  # the bench database
    base: str  # the receiver
    engine: Engine
    receiver_pid: int
    lat_base: str = ""  # the ``lat`` endpoint's receiver, when not ``base``


def cores() -> int:
    return len(os.sched_getaffinity(0))


def _scalar(engine: Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def _drained(engine: Engine, rows: str) -> bool:
    """Whether no row of ``rows`` (a FROM ... WHERE ...) is left: the drain poll.

    An EXISTS, not a count: polled every 20 ms, a count over the queue cost each
    contender's PostgreSQL a few ms per poll (pgqueuer's ~41 us, the dispatcher's
    ~29 us per job measured with pg_stat_statements), time taken from the contender.
    """
    with engine.connect() as conn:
        return not conn.execute(sa.text(f"SELECT EXISTS (SELECT 1 {rows})")).scalar_one()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        if p.wait(60) != 0:
            raise RuntimeError(f"{p.args} exited {p.returncode}")


def _workers(module: str, args: list[str], processes: int) -> list[subprocess.Popen[bytes]]:
    """``processes`` of ``python -m module *args``, each once it wrote ``ready``."""
    procs = [
        subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT, stdout=subprocess.PIPE)
        for _ in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == b"ready"
    except BaseException:
        for p in procs:
            p.kill()
        raise
    return procs


def bare(loop: str, client: str = "aiohttp") -> Callable[[Ctx, int], float]:
    def run(ctx: Ctx, n: int) -> float:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.bare_client",
                f"{ctx.base}/hook",
                str(n),
                "--loop",
                loop,
                "--client",
                client,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return float(out.split()[-1])

    return run


def pgqueuer(batch_size: int | None, processes: int) -> Callable[[Ctx, int], float]:
    async def enqueue_jobs(n: int) -> None:
        conn = await asyncpg.connect(dsn_of[0])
        try:
            await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
            payloads = [body(i) for i in range(n)]
            await Queries(AsyncpgDriver(conn)).enqueue(["post"] * n, payloads, [0] * n)
        finally:
            await conn.close()

    dsn_of: list[str] = [""]

    def run(ctx: Ctx, n: int) -> float:
        dsn_of[0] = dsn(ctx.url)
        extra = [] if batch_size is None else ["--batch-size", str(batch_size)]
        procs = _workers("bench.pgq_worker", [dsn_of[0], f"{ctx.base}/hook", *extra], processes)
        try:
            asyncio.run(enqueue_jobs(n))
            t0 = time.perf_counter()
            _wait(lambda: _drained(ctx.engine, "FROM pgqueuer"), 600, "drain")
            elapsed = time.perf_counter() - t0
        finally:
            stop_all(procs)
        return n / elapsed

    return run


def floor(
    processes: int, effects: bool = False, driver: str = "asyncpg"
) -> Callable[[Ctx, int], float]:
    """The design ceiling (bench/floor_worker.py): the least a dispatcher keeping
    the issue's guarantees does per delivery, in ``processes`` processes; with
    ``effects``, each job's wide ``effects`` row is written at enqueue and updated
    once when delivered (leases in a narrow table of their own); ``driver``:
    asyncpg or psycopg2 (the product's)."""

    def run(ctx: Ctx, n: int) -> float:
        with ctx.engine.begin() as conn:
            conn.execute(sa.text(floor_worker.SCHEMA))
            conn.execute(sa.text("TRUNCATE floor_queue, floor_ledger, floor_attempts"))
        _reset(ctx.engine)
        args = [dsn(ctx.url), f"{ctx.base}/hook", "--driver", driver]
        procs = _workers("bench.floor_worker", args, processes)
        try:
            # The same effects every dispatcher contender gets (insert_effects), each
            # copied to a queue row; without ``effects`` the effect rows then go.
            insert_effects(ctx.engine, n, "floor")
            with ctx.engine.begin() as conn:
                conn.execute(sa.text(_FLOOR_QUEUE), {"linked": effects})
                conn.execute(sa.text("NOTIFY floor"))
            if not effects:
                _reset(ctx.engine)
            t0 = time.perf_counter()
            _wait(lambda: _drained(ctx.engine, "FROM floor_queue"), 600, "drain")
            elapsed = time.perf_counter() - t0
        finally:
            stop_all(procs)
        ledger = _scalar(ctx.engine, "SELECT count(*) FROM floor_ledger")
        attempts = _scalar(ctx.engine, "SELECT count(*) FROM floor_attempts")
        audited = _scalar(ctx.engine, "SELECT count(*) FROM effects WHERE state = 'delivered'")
        if ledger != n or attempts != n or audited != (n if effects else 0):
            raise RuntimeError(
                f"floor: {ledger} of {n} in the ledger, {attempts} attempts logged, "
                f"{audited} effects delivered"
            )
        return n / elapsed

    return run


_FLOOR_QUEUE = (
    "INSERT INTO floor_queue (effect_id, idempotency_key, payload)"
    " SELECT CASE WHEN :linked THEN id END, idempotency_key, CAST(payload AS text)"
    " FROM effects ORDER BY id"
)


def start_dispatchers(
    ctx: Ctx,
    processes: int,
    *args: str,
    env_extra: dict[str, str] | None = None,
    code: Path | str = ROOT,
) -> subprocess.Popen[bytes]:
    """``outbox dispatcher run --processes N *args``, once its workers beat; ``code``: the
    checkout it runs from (another one for an A/B of two commits: same venv, database
    and receiver; its folder first on the path)."""
    code = Path(code or ROOT)
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OUTBOX_", "OTEL_", "PYTHONPATH"))
    }
    env |= env_extra or {}
    env |= {
        "DATABASE_URL": ctx.url,
        "OUTBOX_SSRF_ALLOW_NETWORKS": "127.0.0.0/8",
        "OUTBOX_LOG_LEVEL": "WARNING",
    }
    with ctx.engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE worker_heartbeats"))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_outbox",
            "dispatcher",
            "run",
            "--processes",
            str(processes),
            *args,
        ],
        cwd=code,  # python -m imports spark_outbox from there first
        env=env | ({"PYTHONPATH": str(code)} if code != ROOT else {}),
    )
    want = processes or cores()
    live = "SELECT count(*) FROM worker_heartbeats WHERE stopped_at IS NULL"
    _wait(lambda: _scalar(ctx.engine, live) >= want, 60, "the dispatchers' first heartbeats")
    return proc


_UNFINISHED = "FROM effects WHERE state IN ('pending', 'leased')"


def _reset(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger"))


def dispatcher(
    processes: int,
    endpoint: str = "bench",
    ordering_keys: int = 0,
    options: str = "",
    *,
    code: Path | str = ROOT,
    traced: bool = False,
    counted: bool = True,
    row_unpark: bool = False,
) -> Callable[[Ctx, int], float]:
    """``endpoint``: ``bench`` (no limits), ``bench-limited`` (limits that never bind:
    their bookkeeping only) or ``bench-ordered`` (per-key ordering over
    ``ordering_keys`` keys, effects spread over them round robin); ``options``:
    ``outbox dispatcher run`` options (``bench dispatch -- --settings``); ``code``:
    run the dispatcher of another checkout (its folder first on PYTHONPATH, e.g.
    ``git archive main`` unpacked: today's code on this schema); ``traced``: tracing
    on, exported over OTLP/HTTP to a collector stand-in (bench/otlp_sink.py), every
    effect created in a trace; ``counted=False``: the triggers that keep effect_counts and
    attempt_counts disabled for the round (their cost on the hot path, side by side);
    ``row_unpark``: the unpark trigger as it was before migration 2810, one row at a
    time, for the round (bench/row_unpark.py)."""

    def run(ctx: Ctx, n: int) -> float:
        _reset(ctx.engine)
        if not counted:
            _count_triggers(ctx.engine, "DISABLE")
        # The dispatcher's defaults (concurrency, claim batch size) unless the
        # environment's BENCH_DISPATCH_ARGS says otherwise (how the defaults were chosen).
        extra = os.environ.get("BENCH_DISPATCH_ARGS", "").split() + options.split()
        env: dict[str, str] = {}
        with contextlib.ExitStack() as stack:
            if traced:
                endpoint_url, _ = stack.enter_context(otlp_sink.collector())
                env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = endpoint_url
            if not counted:
                stack.callback(_count_triggers, ctx.engine, "ENABLE")
            if row_unpark:
                from bench.row_unpark import row_unpark as installed

                stack.enter_context(installed(ctx.engine))
            proc = start_dispatchers(ctx, processes, *extra, env_extra=env, code=code)
            return _drain(ctx, n, proc, endpoint, ordering_keys, traced)

    return run


_COUNT_TRIGGERS = {
    "effects": ["effects_count_on_insert", "effects_count_on_update", "effects_count_on_delete"],
    "delivery_attempts": ["delivery_attempts_count_on_insert"],
}


def _count_triggers(engine: Engine, how: str) -> None:
    """ENABLE or DISABLE the count triggers (dispatcher/core/objects/counts.sql)."""
    with engine.begin() as conn:
        for table, names in _COUNT_TRIGGERS.items():
            for name in names:
                conn.execute(sa.text(f"ALTER TABLE {table} {how} TRIGGER {name}"))


def _drain(
    ctx: Ctx, n: int, proc: subprocess.Popen[bytes], endpoint: str, keys: int, traced: bool
) -> float:
    """Deliveries a second from the commit of N effects until none is unfinished."""
    try:
        insert_effects(ctx.engine, n, endpoint, keys, traced)
        t0 = time.perf_counter()
        _wait(lambda: _drained(ctx.engine, _UNFINISHED), 600, "drain")
        elapsed = time.perf_counter() - t0
    finally:
        stop_all([proc])
    delivered = _scalar(ctx.engine, "SELECT count(*) FROM effects WHERE state = 'delivered'")
    attempts = _scalar(ctx.engine, "SELECT count(*) FROM delivery_attempts")
    if delivered != n or attempts != n:
        raise RuntimeError(f"{delivered} of {n} delivered, {attempts} attempts logged")
    return n / elapsed


def latency(
    ctx: Ctx,
    rate: float,
    seconds: float,
    processes: int = 0,
    producers: int = 4,
    backlog: int = 0,
    code: Path | str = ROOT,
) -> tuple[list[float], float, str]:
    """Commit-to-arrival latencies (ms, sorted) at a steady ``rate``; the rate achieved;
    the attempts that did not deliver, by outcome and error (a long tail's cause).

    Producers commit one effect per transaction (INSERT + NOTIFY + COMMIT in one
    round trip, as a producer's ``enqueue`` does) on one shared schedule of
    ``rate``/s (``producers`` threads, each its own connection, so one slow fsync
    does not hold the schedule back) and note ``time.time()`` right after COMMIT.

    ``backlog``: that many older effects of another endpoint (``bench``) are due
    when the round starts (topped up before each round; whatever else the table
    holds, a history, stays), and the dispatcher drains them meanwhile: a fresh
    effect must not wait behind a backlog that is not its own endpoint's.
    """
    if backlog:
        _reset_latency(ctx.engine, backlog)
    else:
        _reset(ctx.engine)
    committed: dict[str, float] = {}
    proc = start_dispatchers(ctx, processes, code=code)
    start = time.perf_counter() + 0.1
    total = int(rate * seconds)
    try:
        threads = [
            threading.Thread(
                target=_produce, args=(ctx, start, rate, range(t, total, producers), committed)
            )
            for t in range(producers)
        ]
        began = time.time() + max(0.0, start - time.perf_counter())
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        achieved = len(committed) / (time.perf_counter() - start)
        ended = time.time()
        unfinished = "FROM effects WHERE endpoint = 'lat' AND state IN ('pending', 'leased')"
        _wait(lambda: _drained(ctx.engine, unfinished), 120, "the last deliveries")
    finally:
        stop_all([proc])
    failed = _failed_attempts(ctx.engine)
    arrivals_at = f"{ctx.lat_base or ctx.base}/arrivals"
    with urllib.request.urlopen(arrivals_at, timeout=30) as resp:  # noqa: S310
        arrivals = json.loads(resp.read())
    first: dict[str, float] = {}
    for key, at in arrivals:
        first.setdefault(key, at)
    LAST_SEND_STARTS[:] = sorted(
        (at - committed[k]) * 1000 for k, at in _send_starts(ctx.engine).items() if k in committed
    )
    LAST_BACKLOG_RATE[:] = [_backlog_rate(ctx.engine, began, ended)] if backlog else []
    never = [k for k in committed if k not in first]
    if never:
        raise RuntimeError(f"{len(never)} of {len(committed)} fresh effects never arrived")
    return sorted((first[k] - committed[k]) * 1000 for k in committed), achieved, failed


# The last latency round's commit-to-send-start times (ms, sorted): where the wait is,
# in the database and the worker's queue or in the send (bench dispatch prints them).
LAST_SEND_STARTS: list[float] = []


# The last backlog round's deliveries/s of the backlog's own endpoint (``bench``) while
# the fresh effects were produced: what a latency gain costs the backlog's drain.
LAST_BACKLOG_RATE: list[float] = []


def _backlog_rate(engine: Engine, began: float, ended: float) -> float:
    """Deliveries/s of the backlog's endpoint between ``began`` and ``ended`` (epoch s),
    by their attempts' start times."""
    with engine.connect() as conn:
        n = conn.execute(
            sa.text(
                "SELECT count(*) FROM delivery_attempts a JOIN effects e ON e.id = a.effect_id"
                " WHERE e.endpoint = 'bench' AND a.outcome = 'delivered'"
                " AND a.started_at >= to_timestamp(:began) AND a.started_at < to_timestamp(:ended)"
            ),
            {"began": began, "ended": ended},
        ).scalar_one()
    return int(n) / max(ended - began, 1e-9)


def _send_starts(engine: Engine) -> dict[str, float]:
    """Each fresh (``lat``) effect's first attempt's start (the worker's clock, epoch s)."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT e.idempotency_key, min(EXTRACT(EPOCH FROM a.started_at))"
                " FROM effects e JOIN delivery_attempts a ON a.effect_id = e.id"
                " WHERE e.endpoint = 'lat' GROUP BY 1"
            )
        ).all()
    return {k: float(at) for k, at in rows}


def _reset_latency(engine: Engine, backlog: int) -> None:
    """The last round's ``lat`` effects gone, then their key ledger rows (a key in the
    ledger is never sent again, so the next round's would never arrive; the ledger's
    trigger writes a deleted finished effect's key there: ledger.sql), the other
    endpoint's due backlog topped up to ``backlog`` effects older than any fresh one;
    the rest of the table stays."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "DELETE FROM delivery_attempts WHERE effect_id IN"
                " (SELECT id FROM effects WHERE endpoint = 'lat')"
            )
        )
        conn.execute(sa.text("DELETE FROM effects WHERE endpoint = 'lat'"))
        conn.execute(sa.text("DELETE FROM key_ledger WHERE endpoint = 'lat'"))
        missing = backlog - int(conn.execute(sa.text(_BACKLOG_DUE)).scalar_one())
        if missing > 0:
            conn.execute(sa.text(_BACKLOG), {"n": missing, "pad": PAD})


_BACKLOG_DUE = "SELECT count(*) FROM effects WHERE endpoint = 'bench' AND state = 'pending'"
_BACKLOG = (
    "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, next_attempt_at)"
    " SELECT 'b' || lpad(to_hex(g + (SELECT coalesce(max(id), 0) FROM effects)), 63, '0'),"
    " 'bench', jsonb_build_object('type', 'invoice.created', 'n', g, 'currency', 'EUR',"
    " 'pad', :pad), 'x', now() - interval '1 hour' FROM generate_series(1, :n) g"
)


def load_history(engine: Engine, n: int, chunk: int = 500_000) -> None:
    """``n`` finished effects (delivered, each with its key ledger row, as a record
    leaves them), in chunks of ``chunk`` each its own transaction, then VACUUM
    ANALYZE: the history a long-running outbox keeps beside its queue."""
    for lo in range(0, n, chunk):
        with engine.begin() as conn:
            conn.execute(sa.text(_HISTORY), {"lo": lo + 1, "hi": min(n, lo + chunk)})
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(
            sa.text("VACUUM (ANALYZE) effects, key_ledger")
        )


_HISTORY = """
WITH made AS (
    INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, state,
                         attempt_count, created_at, updated_at, delivered_at, next_attempt_at)
    SELECT 'h' || lpad(to_hex(g), 63, '0'), 'bench',
           jsonb_build_object('type', 'invoice.created', 'n', g), 'x', 'delivered', 1,
           now() - interval '1 day', now() - interval '1 day', now() - interval '1 day',
           now() - interval '1 day'
    FROM generate_series(:lo, :hi) g
    RETURNING idempotency_key, endpoint, delivered_at
)
INSERT INTO key_ledger (idempotency_key, endpoint, payload_sha256, delivered_at)
SELECT idempotency_key, endpoint, 'x', delivered_at FROM made
"""


def _failed_attempts(engine: Engine) -> str:
    """``none``, or e.g. ``retry Disconnected x1``: the attempts that did not deliver."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT outcome, coalesce(error_class, status_code::text, '?'), count(*)"
                " FROM delivery_attempts WHERE outcome <> 'delivered' GROUP BY 1, 2 ORDER BY 3 DESC"
            )
        ).all()
    return ", ".join(f"{outcome} {error} x{n}" for outcome, error, n in rows) or "none"


def _produce(
    ctx: Ctx, start: float, rate: float, numbers: range, committed: dict[str, float]
) -> None:
    conn = psycopg2.connect(dsn(ctx.url))
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            for i in numbers:
                pause = start + i / rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                key = f"{i:064x}"
                cur.execute(_PRODUCE, (key, json.dumps(document(i))))
                committed[key] = time.time()
    finally:
        conn.close()


_PRODUCE = (
    "BEGIN; INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256)"
    " VALUES (%s, 'lat', CAST(%s AS jsonb), 'x'); SELECT pg_notify('outbox_effects', 'bench');"
    " COMMIT"
)
