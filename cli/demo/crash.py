"""``outbox demo --crash``: kill -9 the Spark driver mid-commit and a dispatcher mid-drain.

Both are restarted, and the report then shows what the guarantee promises:
the receiver's unique receipts equal the effects a clean run expects (same
keys, none missing, none extra), and the invoices equal a clean run's, row
for row (a digest over every column). The clean run is the same Spark job on
the same input in a second, fresh database.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import receivers, tally
from spark_outbox.cli.demo.procs import Child, DemoFailed, tail
from spark_outbox.cli.demo.progress import say
from spark_outbox.cli.tools import scratch
from spark_outbox.core import db

if TYPE_CHECKING:
    from spark_outbox.cli.demo.database import DemoDatabase
    from spark_outbox.cli.demo.dispatch import Dispatchers
    from spark_outbox.cli.demo.spark_stages import SparkStages

WEBHOOK = "billing-webhook"
KILL_DISPATCHER_AT = 0.3  # of the effects, delivered


def kill_a_dispatcher_mid_drain(
    engine: Engine, dispatchers: Dispatchers, events: list[str], timeout_s: float = 300
) -> None:
    """SIGKILL one replica once ~30% is delivered, then start a replacement.

    Its leased effects come back when their lease expires (5 s in the demo);
    any it had sent but not recorded are sent again with the same key, and the
    receiver's dedupe absorbs them (raw > unique shows how many).
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            states = tally.effects_by_endpoint(conn)
        total = sum(sum(s.values()) for s in states.values())
        done = sum(s.get("delivered", 0) for s in states.values())
        leased = sum(s.get("leased", 0) for s in states.values())
        if total and done >= KILL_DISPATCHER_AT * total and leased > 0:
            break
        if total and done + sum(s.get("dead", 0) for s in states.values()) == total:
            events.append("the outbox drained before a dispatcher could be killed mid-drain")
            return
        time.sleep(0.05)
    victim = dispatchers.alive()[0]
    victim.kill()
    victim.wait(10)
    replacement = dispatchers.start_one()
    event = (
        f"killed {victim.name} (pid {victim.pid}) with SIGKILL at {done:,}/{total:,} delivered, "
        f"{leased:,} effects under lease; started {replacement.name}"
    )
    events.append(event)
    say(f"    CRASH: {event}")


def kill_driver_mid_commit(
    child: Child, engine: Engine, events: list[str], timeout_s: float = 600
) -> None:
    """SIGKILL the Spark driver (and its JVM) inside its open commit transaction.

    The run is started with ``OUTBOX_SPARK_PHASES=before_commit:300``: the sink's
    own hook (spark_outbox.spark.phases) holds the driver after the marker, the invoices
    and the effects are written and before COMMIT, and says so on stderr. The
    kill lands there, so it is mid-commit by construction, not by luck.
    """
    marker = "outbox-phase: before_commit"
    deadline = time.monotonic() + timeout_s
    while marker not in _read(child.log_path):
        if not child.running():
            raise DemoFailed(f"the Spark driver exited before its commit:\n{tail(child.log_path)}")
        if time.monotonic() > deadline:
            child.kill()
            raise DemoFailed("the Spark driver never reached its commit")
        time.sleep(0.1)
    with engine.connect() as conn:
        open_tx, age_s = tally.open_transactions(conn)
        before = tally.committed_batches(conn, "billing")
    child.kill()
    child.wait(30)
    event = (
        f"killed the Spark driver (pid {child.pid}, with its JVM) with SIGKILL inside its "
        f"commit transaction ({open_tx} open transaction(s), the oldest {age_s:.1f} s old): "
        "marker, invoices and effects written, COMMIT not reached"
    )
    events.append(event)
    say(f"    CRASH: {event}")
    # PostgreSQL rolls the transaction back when the dead driver's connection closes.
    time.sleep(1)
    with engine.connect() as conn:
        after = tally.committed_batches(conn, "billing")
        invoices = tally.invoice_digest(conn).rows
    events.append(
        f"after the kill: {after['batches']} committed batches (before: {before['batches']}), "
        f"{invoices} invoices, {after['effects_new']} effects visible: nothing of it leaked"
    )
    say(f"    {events[-1]}")


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def compare_with_clean_run(
    spark: SparkStages,
    demo_db: DemoDatabase,
    engine: Engine,
    recv: receivers.Receivers,
    events: list[str],
) -> dict[str, Any]:
    """Run the same job on the same input into a fresh database; compare."""
    clean_name = scratch.database_name(demo_db.url) + "_clean"
    clean_url = scratch.recreate_database(demo_db.server_url, clean_name)
    try:
        db.upgrade(clean_url, db.ALL_HEADS)
        from spark_outbox.cli.demo.database import register_endpoints

        register_endpoints(clean_url, recv, fail_rate=0)  # same names; nothing is sent
        clean_engine = db.create_engine(clean_url, pool_size=1)
        try:
            spark.run_clean_reference(clean_url, clean_engine)
            with clean_engine.connect() as conn:
                clean = tally.invoice_digest(conn)
                expected = tally.effect_keys(conn, WEBHOOK)
        finally:
            clean_engine.dispose()
    finally:
        scratch.drop_database(demo_db.server_url, clean_name)
    with engine.connect() as conn:
        crashed = tally.invoice_digest(conn)
    received = receivers.unique_keys(recv.webhook_url)
    return {
        "events": events,
        "invoices": {"rows": crashed.rows, "digest": crashed.digest},
        "clean_invoices": {"rows": clean.rows, "digest": clean.digest},
        "expected_webhooks": len(expected),
        "receiver_unique": len(received),
        "same_keys": received == expected,
        "missing_keys": len(expected - received),
        "extra_keys": len(received - expected),
    }


def checks(c: dict[str, Any]) -> dict[str, bool]:
    if not any(e.startswith("killed") for e in c["events"]):
        raise DemoFailed("--crash killed nothing: " + "; ".join(c["events"]))
    return {
        "crash: invoices equal a clean run": c["invoices"] == c["clean_invoices"],
        "crash: receiver unique keys = a clean run's webhook effects": c["same_keys"],
    }
