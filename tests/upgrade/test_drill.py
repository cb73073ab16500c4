"""The upgrade drill: the previous release keeps delivering and committing while this
release's ``outbox db upgrade`` runs (docs/operations.md, "Upgrading").

A database migrated by the previous release; its dispatcher drains a steady stream
of effects (its ``enqueue()`` in a loop, and the billing stream job's invoices,
committed by its Spark sink in local mode) to the reference webhook receiver and the
mail catcher. Then this release's ``outbox db upgrade`` to head, while they run;
then more batches on the new schema, a dispatcher of this release joins and the old
one leaves (a rolling upgrade), and everything stops. Each effect reached its
receiver exactly once, every batch committed once, and this release's ``outbox
verify --once`` finds nothing wrong. Whatever migrations main holds run here.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, revisions
from tests import ROOT
from tests.conftest import insert_endpoint
from tests.upgrade import previous
from tests.upgrade.conftest import Processes, new_outbox, run

pytestmark = [pytest.mark.slow, pytest.mark.spark]

SECRET = "whsec_dXBncmFkZS1kcmlsbC1zZWNyZXQtMTIzNDU2"
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
DISPATCHER = {
    "OUTBOX_SSRF_ALLOW_NETWORKS": "127.0.0.0/8",
    "OUTBOX_LEASE_S": "5",
    "OUTBOX_POLL_INTERVAL_S": "0.2",
    "OUTBOX_HEARTBEAT_INTERVAL_S": "0.5",
    "OUTBOX_SHUTDOWN_TIMEOUT_S": "5",
    "OUTBOX_PROCESSES": "1",
    "OUTBOX_LOG_LEVEL": "WARNING",
}


class Drill:
    """The database, the processes, and the steps of the drill."""

    def __init__(self, old: previous.Installed, url: str, procs: Processes, work: Path) -> None:
        self.old, self.url, self.procs, self.work = old, url, procs, work
        self.engine: Engine = db.create_engine(url, pool_size=2)
        self.env = previous.clean_env(DATABASE_URL=url, SPARK_LOCAL_IP="127.0.0.1")
        self.incoming = work / "incoming"
        self.fed_from = time.time()

    def old_command(self, *args: str) -> None:
        done = run(self.old.outbox(*args), self.env, cwd=self.work)
        assert done.returncode == 0, f"previous release: outbox {' '.join(args)}: {done.stderr}"

    def scalar(self, sql: str, **params: Any) -> Any:
        with self.engine.connect() as conn:
            return conn.execute(sa.text(sql), params).scalar()

    def rows(self, sql: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            return list(conn.execute(sa.text(sql), params))

    def feed(self, day: str) -> None:
        """One day of events into the stream's input: one micro-batch. Written aside,
        then renamed, so Spark never lists a half-written file; each a second younger
        than the one before: Spark reads files in modification order, and a day read
        after a later one is behind the watermark (dropped)."""
        aside = self.work / f".{day}.json"
        shutil.copy(self.work / "events" / f"events-{day}.json", aside)
        at = self.fed_from + len(list(self.incoming.iterdir()))
        os.utime(aside, (at, at))
        aside.rename(self.incoming / f"events-{day}.json")

    def wait(self, done: Callable[[], bool], what: str, timeout_s: float = 240) -> None:
        """Until ``done``; at once when a process of the drill exited or the producer
        met an error (what a migration that is not online causes), saying which."""
        deadline = time.monotonic() + timeout_s
        while not done():
            trouble = self.trouble()
            if trouble:
                raise AssertionError(f"while waiting for {what}: {trouble}")
            if time.monotonic() > deadline:
                logs = {n: errors_in(self.procs.log(n)) for n in self.procs.running}
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}: {logs}")
            time.sleep(0.2)

    def trouble(self) -> str | None:
        for name, proc in self.procs.running.items():
            if proc.poll() is not None:
                return f"{name} exited {proc.returncode}: {errors_in(self.procs.log(name))}"
        lines = self.procs.log("producer").splitlines()
        failed = [line for line in lines if line.startswith('{"error"')]
        return f"the producer of the previous release: {failed[0]}" if failed else None

    def invoiced(self, day: str) -> None:
        """Wait for the day's invoices: the stream commits a day once the next day's
        events move its watermark past it."""
        expected = expected_invoices(self.work / "events", day)
        sql = "SELECT count(*) FROM invoices WHERE invoice_date = :d"
        self.wait(lambda: self.scalar(sql, d=day) == expected, f"the invoices of {day}")

    def committed(self, markers: int) -> None:
        """Wait for the stream's first ``markers`` commits (both queries count)."""
        sql = "SELECT count(*) FROM batches"
        self.wait(lambda: self.scalar(sql) >= markers, f"{markers} committed batch(es)")

    def sent_by(self, worker: str, after: dt.datetime | None = None) -> None:
        """Wait for a delivery by ``worker`` (after ``after``)."""
        sql = (
            "SELECT count(*) FROM delivery_attempts WHERE worker_id = :w AND outcome = "
            "'delivered' AND started_at > coalesce(CAST(:t AS timestamptz), '-infinity')"
        )
        self.wait(lambda: self.scalar(sql, w=worker, t=after) > 0, f"a delivery by {worker}")

    def start_dispatcher(self, name: str, argv: list[str]) -> None:
        env = self.env | DISPATCHER | {"OUTBOX_WORKER_ID": name}
        self.procs.start(name, argv, env)


def errors_in(log: str) -> str:
    """The lines of a log that name an error (Spark's are long), else its end."""
    lines = [line for line in log.splitlines() if "rror" in line or "xception" in line]
    return "\n".join(lines[-12:])[-3000:] if lines else log[-1500:]


def expected_invoices(events: Path, day: str) -> int:
    """One invoice per customer and currency with events that day (no bad rows here)."""
    lines = (events / f"events-{day}.json").read_text().splitlines()
    return len({(e["customer_id"], e["currency"]) for e in map(json.loads, lines)})


@pytest.mark.timeout(900)  # a Spark stream on a loaded machine: minutes, not seconds
def test_the_previous_release_keeps_delivering_and_committing_while_the_schema_is_upgraded(
    previous_release: previous.Installed, empty_url: str, processes: Processes, tmp_path: Path
) -> None:
    drill = Drill(previous_release, empty_url, processes, tmp_path)
    try:
        _start_the_previous_release(drill)
        upgrade_started, upgrade_ended = _upgrade_under_load(drill)
        _roll_the_dispatchers(drill)
        _check(drill, upgrade_started, upgrade_ended)
    finally:
        drill.engine.dispose()


def _start_the_previous_release(drill: Drill) -> None:
    """The previous release migrates and starts; the endpoints are registered (their
    ports chosen first, so everything starts at once: Spark takes longest)."""
    drill.old_command("db", "upgrade", "heads")
    versions = {r[0] for r in drill.rows("SELECT version_num FROM alembic_version")}
    assert drill.old.release.revision in versions, versions
    hook_port, smtp_port, mail_http_port = (scratch.free_port() for _ in range(3))
    insert_endpoint(
        drill.engine, "billing-webhook", url=f"http://127.0.0.1:{hook_port}/hook",
        signing_secret=SECRET,
    )  # fmt: skip
    insert_endpoint(
        drill.engine, "billing-email", kind="email", url=None, signing_secret=None,
        smtp_host="127.0.0.1", smtp_port=smtp_port, mail_from="billing@example.com",
    )  # fmt: skip
    drill.incoming.mkdir()
    drill.procs.start(
        "stream",
        drill.old.outbox(
            "spark", "run", "billing", "--mode", "stream", "--input", str(drill.incoming),
            "--checkpoint", str(drill.work / "checkpoint"), "--no-volume-guard",
        ),
        drill.env,
    )  # fmt: skip
    drill.procs.start(
        "receiver",
        new_outbox("receiver", "serve", "--port", str(hook_port),
                   "--jsonl", str(drill.work / "receiver.jsonl")),
        drill.env | {"OUTBOX_RECEIVER_SECRET": SECRET},
    )  # fmt: skip
    drill.procs.start(
        "mailcatcher",
        new_outbox("mailcatcher", "serve", "--port", str(smtp_port), "--http-port",
                   str(mail_http_port), "--jsonl", str(drill.work / "mailcatcher.jsonl")),
        drill.env,
    )  # fmt: skip
    drill.start_dispatcher("old-dispatcher", drill.old.outbox("dispatcher", "run"))
    producer = [str(drill.old.python), str(ROOT / "tests" / "upgrade" / "producer.py")]
    drill.procs.start("producer", [*producer, drill.url, "billing-webhook", "0.05"], drill.env)
    drill.old_command(
        "spark", "generate", "--customers", "4", "--events", "60", "--days", str(len(DAYS)),
        "--start", DAYS[0], "--out", str(drill.work / "events"),
    )  # fmt: skip
    drill.feed(DAYS[0])
    drill.committed(1)  # the stream's first micro-batch (the day is not closed yet)


def _upgrade_under_load(drill: Drill) -> tuple[dt.datetime, dt.datetime]:
    """This release's ``outbox db upgrade`` while a micro-batch is on its way (the one
    that closes the first day), the producer enqueues and the dispatcher sends; then the
    previous release's sink commits the next day on the new schema."""
    drill.feed(DAYS[1])
    started = drill.scalar("SELECT clock_timestamp()")
    upgraded = run(new_outbox("db", "upgrade", "heads"), drill.env)
    ended = drill.scalar("SELECT clock_timestamp()")
    assert upgraded.returncode == 0, upgraded.stderr
    assert revisions.read(drill.engine).current == revisions.head()
    trouble = drill.trouble()
    assert trouble is None, trouble
    drill.feed(DAYS[2])
    drill.invoiced(DAYS[0])
    drill.invoiced(DAYS[1])
    return started, ended


def _roll_the_dispatchers(drill: Drill) -> None:
    """A dispatcher of this release joins, the previous release's leaves, the new one
    sends what the producer still enqueues; then everything stops."""
    drill.start_dispatcher("new-dispatcher", new_outbox("dispatcher", "run"))
    drill.sent_by("new-dispatcher")
    assert drill.procs.stop("old-dispatcher") == 0, drill.procs.log("old-dispatcher")
    left = drill.scalar("SELECT clock_timestamp()")
    drill.sent_by("new-dispatcher", after=left)
    assert drill.procs.stop("producer") == 0, drill.procs.log("producer")
    assert drill.procs.stop("stream", timeout_s=120) == 0, drill.procs.log("stream")
    drill.wait(
        lambda: drill.scalar("SELECT count(*) FROM effects WHERE state <> 'delivered'") == 0,
        "every effect delivered",
        timeout_s=120,
    )
    assert drill.procs.stop("new-dispatcher") == 0, drill.procs.log("new-dispatcher")


def _check(drill: Drill, upgrade_started: dt.datetime, upgrade_ended: dt.datetime) -> None:
    produced = json.loads(drill.procs.log("producer").strip().splitlines()[-1])
    assert produced["errors"] == [] and produced["enqueued"] > 0, produced
    # The drill overlapped the upgrade: batches and sends before it, and after it by
    # the previous release's sink and dispatcher.
    committed = [r[0] for r in drill.rows("SELECT committed_at FROM batches")]
    assert min(committed) < upgrade_started and max(committed) > upgrade_ended
    old_sends_after = drill.scalar(
        "SELECT count(*) FROM delivery_attempts WHERE worker_id = 'old-dispatcher' "
        "AND started_at > :t",
        t=upgrade_ended,
    )
    assert old_sends_after > 0
    # Nothing lost, nothing doubled: each effect reached its receiver once (every line of
    # a receipts file is one delivery that reached it, a duplicate too).
    for endpoint, receiver in (("billing-webhook", "receiver"), ("billing-email", "mailcatcher")):
        keys = drill.rows("SELECT idempotency_key FROM effects WHERE endpoint = :e", e=endpoint)
        lines = (drill.work / f"{receiver}.jsonl").read_text().splitlines()
        received = [json.loads(line)["idempotency_key_header"].strip() for line in lines]
        assert sorted(received) == sorted(k[0] for k in keys), endpoint
        stats = httpx.get(drill.procs.first_json(receiver)["url"] + "/stats", timeout=10).json()
        assert stats["raw"] == stats["unique"] == len(keys), (receiver, stats)
    producer_keys = drill.scalar(
        "SELECT count(*) FROM effects WHERE job IS NULL AND state = 'delivered'"
    )
    assert producer_keys == produced["enqueued"]
    # Every batch committed once: each query's micro-batches 0..n, no gap, no repeat.
    for job, numbers in drill.rows(
        "SELECT job, array_agg(split_part(batch_id, '/', 2)::int ORDER BY split_part(batch_id, "
        "'/', 2)::int) FROM batches "
        "GROUP BY job"
    ):
        assert numbers == list(range(len(numbers))), (job, numbers)
    verified = run(new_outbox("verify", "--once"), drill.env)
    assert verified.returncode == 0, verified.stdout + verified.stderr
