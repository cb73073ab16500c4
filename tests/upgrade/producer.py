"""A web application's producer of the previous release: ``enqueue()`` one effect at a
time, each in its own transaction, until SIGTERM; then one JSON line on stdout,
``{"enqueued": n, "errors": [...]}`` (and ``{"error": ...}`` as each happens).

Run by the previous release's Python (tests/upgrade/test_drill.py), so it imports
that release's ``enqueue``: only its public producer API, stable across releases.
An error is kept and the same effect tried again: the drill fails on any.
"""

from __future__ import annotations

import hashlib
import json
import signal
import sys
import time
from typing import Any

from spark_outbox.core import db
from spark_outbox.core.enqueue import enqueue


def key(n: int) -> str:
    return hashlib.sha256(f"upgrade-drill:{n}".encode()).hexdigest()


def main(url: str, endpoint: str, interval_s: float) -> int:
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    engine = db.create_engine(url, pool_size=1)
    enqueued, errors = 0, []
    print(json.dumps({"started": True}), flush=True)
    while not stopping and len(errors) < 50:
        payload: dict[str, Any] = {"n": enqueued, "kind": "drill"}
        try:
            with engine.begin() as conn:
                enqueue(conn, idempotency_key=key(enqueued), endpoint=endpoint, payload=payload)
            enqueued += 1
        except Exception as exc:  # kept and shown: the drill fails on any
            first_line = (str(exc).strip().splitlines() or [""])[0]
            errors.append(f"{type(exc).__name__}: {first_line}"[:300])
            print(json.dumps({"error": errors[-1]}), flush=True)  # the drill stops at once
        time.sleep(interval_s)
    engine.dispose()
    print(json.dumps({"enqueued": enqueued, "errors": errors}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
