"""A year of outbox history in miniature, loaded in SQL (``generate_series``): minutes
for 10M effects, not hours. For the history bench and the tests that prove its
mechanisms at small scale.

What a year of the billing job leaves behind (``history.sql`` says each part):
markers, effects (95% delivered, 4% dead, 1% cancelled), their attempts (3 on
average), a key ledger as big as the delivered effects (the keys of effects a
purge deleted before: no effect row has them), and the rejects the markers
count. Chunks of effects load side by side on ``workers`` connections (each chunk
its own transaction); every row is a function of its number, so the result does
not depend on how the chunks were shared.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.engine import Engine

from spark_outbox.core import wakeup
from spark_outbox.core.sqlfile import queries_beside

_Q = queries_beside(__file__, "history.sql")

PER_BATCH = 1000  # effects a marker commits
ENDPOINTS = ("billing-webhook", "billing-email", "partner-webhook")


def load(
    engine: Engine,
    *,
    effects: int,
    days: int = 365,
    now: dt.datetime | None = None,
    first: int = 1,
    per_batch: int = PER_BATCH,
    chunk: int = 250_000,
    workers: int = 2,
) -> None:
    """``effects`` effects numbered from ``first`` (1 + a multiple of ``per_batch``),
    ``per_batch`` a marker, over ``days`` days up to ``now``, in chunks of ``chunk``."""
    if first % per_batch != 1 % per_batch:
        raise ValueError(f"first={first}: use 1 + a multiple of per_batch ({per_batch})")
    chunk = max(per_batch, chunk - chunk % per_batch)  # a batch never spans two chunks
    params = {"n_effects": effects, "days": days, "per_batch": per_batch, "first": first}
    params["now"] = now or dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        conn.execute(_Q["endpoints"])

    def one(lo: int) -> None:
        bounds = {**params, "lo": lo, "hi": min(first + effects - 1, lo + chunk - 1)}
        with engine.begin() as conn:
            for name in ("batches", "effects", "rejects"):
                conn.execute(_Q[name], bounds)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, range(first, first + effects, chunk)))


def burst(engine: Engine, *, effects: int, first: int, endpoint: str, recipients: int) -> None:
    """A fresh committed batch of ``effects`` pending effects for ``endpoint``, numbered
    from ``first`` (after the history's), with the history's ``recipients``; the
    dispatchers are woken at its commit."""
    params = {"n": effects, "first": first, "endpoint": endpoint, "recipients": recipients}
    with engine.begin() as conn:
        conn.execute(_Q["burst"], params)
        wakeup.notify(conn, "burst")


def key_of(i: int) -> str:
    """The idempotency key of effect ``i``."""
    return hashlib.sha256(f"effect-{i}".encode()).hexdigest()


def recipient_of(i: int, effects: int) -> str:
    return f"customer-{i % max(1, effects // 5)}@example.com"


def reference_of(i: int) -> str:
    """Two effects share an invoice reference (its webhook and its e-mail)."""
    return f"INV-{(i + 1) // 2:08d}"
