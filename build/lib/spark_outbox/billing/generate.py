"""A deterministic generator of usage events for the billing job (JSON lines).

Same ``seed``, same files, byte for byte. One file per day
(``events-YYYY-MM-DD.json``), events in time order. ``bad_rows`` adds rows the
job must reject with a reason (never drop): negative units, no customer id, an
unreadable timestamp, no unit price, and events of customers without an e-mail
address (their invoice is a valid result; only the e-mail effect is rejected).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import random
import time
from pathlib import Path

CURRENCIES = ("EUR", "USD", "GBP")
BAD_KINDS = ("negative_units", "no_customer", "bad_timestamp", "no_price", "no_email")


@dataclasses.dataclass(frozen=True)
class Generated:
    files: tuple[Path, ...]
    events: int
    bad_rows: int


def generate(
    out: Path,
    *,
    customers: int,
    events: int,
    seed: int,
    bad_rows: int = 0,
    start: dt.date = dt.date(2026, 1, 1),
    days: int = 3,
) -> Generated:
    rng = random.Random(seed)  # noqa: S311  (reproducible test data, not secrets)
    out.mkdir(parents=True, exist_ok=True)
    by_day: dict[dt.date, list[dict[str, object]]] = {
        start + dt.timedelta(d): [] for d in range(days)
    }
    for i in range(events):
        day = start + dt.timedelta(days=i * days // max(events, 1))
        by_day[day].append(_event(rng, i, day, rng.randrange(customers)))
    for j in range(bad_rows):
        day = start + dt.timedelta(days=j % days)
        by_day[day].append(_bad_event(rng, events + j, day, BAD_KINDS[j % len(BAD_KINDS)], j))
    files = []
    # A streaming file source reads files in modification order, and files
    # written within the same millisecond tie in an unspecified order: a day
    # read after a later day is behind the watermark and silently dropped. Each
    # day's file gets its own modification time, one second after the previous.
    first_mtime = time.time() - days
    for n, (day, rows) in enumerate(by_day.items()):
        rows.sort(key=lambda r: (str(r["ts"]), str(r["event_id"])))
        path = out / f"events-{day.isoformat()}.json"
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
        os.utime(path, (first_mtime + n, first_mtime + n))
        files.append(path)
    return Generated(tuple(files), events + bad_rows, bad_rows)


def _event(rng: random.Random, i: int, day: dt.date, customer: int) -> dict[str, object]:
    second = rng.randrange(86_400)
    ts = dt.datetime.combine(day, dt.time(), dt.UTC) + dt.timedelta(seconds=second)
    return {
        "customer_id": f"cust-{customer:05d}",
        "event_id": f"evt-{i:09d}",
        "ts": ts.isoformat().replace("+00:00", "Z"),
        "units": rng.randint(1, 100),
        "unit_price": f"{rng.randint(1, 5000) / 10000:.4f}",
        "currency": CURRENCIES[customer % len(CURRENCIES)],
        "customer_email": f"cust-{customer:05d}@example.test",
    }


def _bad_event(rng: random.Random, i: int, day: dt.date, kind: str, j: int) -> dict[str, object]:
    event = _event(rng, i, day, 0)
    if kind == "negative_units":
        event["units"] = -rng.randint(1, 10)
    elif kind == "no_customer":
        event["customer_id"] = None
    elif kind == "bad_timestamp":
        event["ts"] = f"{day.isoformat()} at noon"
    elif kind == "no_price":
        event["unit_price"] = None
    else:
        event["customer_id"] = f"cust-noemail-{j:03d}"
        event["customer_email"] = None
    return event
