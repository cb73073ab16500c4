"""``bench dispatch --valves``: the claim with the held-batch exclusion (migration
1321) vs main's ``claimable_effects``, side by side in one run.

Both contenders run ``outbox dispatcher run --processes 1`` on the same database;
before each, ``claimable_effects`` is re-created with that contender's
definition (``CREATE OR REPLACE VIEW``: same columns), and the outbox holds
what the valve is about: one held batch of ``HELD`` effects (its marker held,
its rows parked at ``next_attempt_at = 'infinity'`` as the commit leaves them)
and one committed batch of the N effects to deliver, written by a Spark run
(``run_id`` set, so every claimed row goes through the visibility check and,
on this branch, the held-batch filter). The time runs from the commit of the N
effects until none of them is unfinished. A third contender leaves the held
rows unparked (due since '-infinity', at the front of ix_effects_due): what the view's
exclusion alone would cost, the reason the commit parks them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import sqlalchemy as sa

from bench import contenders
from bench.payload import PAD
from spark_outbox.core import wakeup

HELD = 20_000

MAIN_VIEW = """
CREATE OR REPLACE VIEW claimable_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
"""

VALVE_VIEW = """
CREATE OR REPLACE VIEW claimable_effects AS
SELECT e.*
FROM visible_effects e
WHERE e.state IN ('pending', 'leased')
  AND e.endpoint NOT IN (SELECT p.name FROM endpoints p WHERE NOT p.enabled)
  AND (e.run_id IS NULL
       OR e.run_id NOT IN (SELECT b.run_id FROM batches b WHERE b.hold_state = 'held'))
"""

_BATCH = """
INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload, payload_sha256,
                     next_attempt_at)
SELECT lpad(to_hex(g), 63, '0') || :tag, 'bench', :batch_id, :run_id, 'bench',
       jsonb_build_object('type', 'invoice.created', 'n', g, 'currency', 'EUR', 'pad', :pad),
       'x', :next_attempt_at
FROM generate_series(1, :n) g
"""


def claim_with(view: str, *, parked: bool = True) -> Callable[[contenders.Ctx, int], float]:
    def run(ctx: contenders.Ctx, n: int) -> float:
        with ctx.engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE delivery_attempts, effects, key_ledger, batches"))
            conn.execute(sa.text(view))
            _batch(conn, "held", HELD, held=True, parked=parked)
        proc = contenders._dispatchers(ctx, 1, "--concurrency", "64")
        try:
            with ctx.engine.begin() as conn:
                _batch(conn, "due", n, held=False)
                wakeup.notify(conn, "bench")
            t0 = time.perf_counter()
            unfinished = (
                "SELECT count(*) FROM effects WHERE batch_id = 'due' "
                "AND state IN ('pending', 'leased')"
            )
            contenders._wait(lambda: contenders._scalar(ctx.engine, unfinished) == 0, 600, "drain")
            elapsed = time.perf_counter() - t0
        finally:
            contenders._stop([proc])
        delivered = contenders._scalar(
            ctx.engine, "SELECT count(*) FROM effects WHERE state = 'delivered'"
        )
        if delivered != n:
            raise RuntimeError(f"{delivered} delivered, expected {n} (the held batch must wait)")
        return n / elapsed

    return run


def _batch(conn: sa.Connection, batch_id: str, n: int, *, held: bool, parked: bool = True) -> None:
    run_id = uuid.uuid4()
    conn.execute(
        sa.text(
            "INSERT INTO batches (job, batch_id, run_id, effects_new, hold_state) "
            "VALUES ('bench', :batch_id, :run_id, :n, :hold)"
        ),
        {"batch_id": batch_id, "run_id": run_id, "n": n, "hold": "held" if held else None},
    )
    params = {
        "tag": "1" if held else "2",
        "batch_id": batch_id,
        "run_id": run_id,
        "n": n,
        "pad": PAD,
        "next_attempt_at": ("infinity" if parked else "-infinity") if held else "now",
    }
    conn.execute(sa.text(_BATCH), params)
