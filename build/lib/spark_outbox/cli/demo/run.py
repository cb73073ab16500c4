"""The order of the demo: database, receivers, endpoints, dispatchers, Spark, drain, report.

Every component is its own ``outbox`` process, as in production. Loopback is
allow-listed past the dispatcher's SSRF guard for the demo's own dispatchers
only (``OUTBOX_SSRF_ALLOW_NETWORKS=127.0.0.0/8``), and the demo says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import (
    crash,
    database,
    dispatch,
    guard,
    receivers,
    report,
    serve,
    spark_stages,
)
from spark_outbox.cli.demo.progress import Stopwatch, say
from spark_outbox.core import db
from spark_outbox.core.settings import Settings

LOOPBACK = "127.0.0.0/8"


def child_env(url: str, settings: Settings) -> dict[str, str]:
    """The environment of every child: this run's database, JSON logs, Spark on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return env | {
        "DATABASE_URL": url,
        "OUTBOX_STATE_DIR": str(settings.state_dir.absolute()),
        "OUTBOX_LOG_FORMAT": "json",
        "OUTBOX_LOG_LEVEL": "INFO",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    }


def dispatcher_env(env: dict[str, str]) -> dict[str, str]:
    return env | {
        "OUTBOX_SSRF_ALLOW_NETWORKS": LOOPBACK,
        "OUTBOX_RETRY_SCHEDULE_S": ",".join(str(s) for s in database.DEMO_RETRY_SCHEDULE_S),
        # Shorter than the default 60 s, so a killed dispatcher's leases come back soon.
        "OUTBOX_LEASE_S": "30",
        "OUTBOX_POLL_INTERVAL_S": "0.5",
    }


def run(args: argparse.Namespace, settings: Settings) -> int:
    run_dir = (settings.state_dir / "demo").absolute()
    shutil.rmtree(run_dir, ignore_errors=True)
    demo = Demo(args, settings, run_dir)
    try:
        result, token = demo.pipeline()
        say(report.render(result))
        if args.report_json:
            Path(args.report_json).write_text(json.dumps(result, indent=2, default=str) + "\n")
            say(f"report written to {args.report_json}")
        ok = all(result["checks"].values())
        if not args.no_serve:
            _serve_until_interrupted(result, token)
        return 0 if ok else 1
    finally:
        demo.stop_all()


class Demo:
    """One run: the processes it started (stopped in reverse order) and its stopwatch."""

    def __init__(self, args: argparse.Namespace, settings: Settings, run_dir: Path) -> None:
        self.args = args
        self.settings = settings
        self.run_dir = run_dir
        self.logs = run_dir / "logs"
        self.logs.mkdir(parents=True)
        self.sw = Stopwatch()
        self.stoppers: list[Callable[[], Any]] = []
        self.crash_events: list[str] = []
        self.held: dict[str, Any] = {}

    def stop_all(self) -> None:
        for stop in reversed(self.stoppers):
            stop()

    def pipeline(self) -> tuple[dict[str, Any], str]:
        a = self.args
        say(f"spark-outbox demo: {a.customers:,} customers, {a.events:,} events, seed {a.seed}")
        say(f"logs of every process: {self.logs}")
        demo_db, env, recv = self.setup()
        engine = db.create_engine(demo_db.url, pool_size=2)
        self.stoppers.append(engine.dispose)
        spark = spark_stages.SparkStages(a, env, self.run_dir, self.logs, engine)
        self.run_spark_and_dispatch(spark, env, engine)
        result = report.collect(engine, recv)
        result["notes"] = spark.notes
        result["volume_guard"] = self.held
        result["checks"] |= guard.checks(self.held)
        if a.crash:
            with self.sw.stage("crash check: clean reference run"):
                result["crash"] = crash.compare_with_clean_run(
                    spark, demo_db, engine, recv, self.crash_events
                )
                result["checks"] |= crash.checks(result["crash"])
        with self.sw.stage("API + support token"):
            api, base = serve.start_api(env, self.logs)
            self.stoppers.append(api.stop)
            result["support_url"], result["api_url"] = f"{base}/ui", base
            token = serve.support_token(demo_db.url)
        result["stages"] = self.sw.stages
        result["sizes"] = {"customers": a.customers, "events": a.events, "seed": a.seed}
        return result, token

    def setup(self) -> tuple[database.DemoDatabase, dict[str, str], receivers.Receivers]:
        with self.sw.stage("database: start, fresh database, migrate"):
            demo_db = database.prepare(self.settings)
            say(f"    {db.redact(demo_db.url)} at schema head")
        env = child_env(demo_db.url, self.settings)
        with self.sw.stage("receivers: webhook receiver + SMTP catcher"):
            recv = receivers.start(
                env, self.logs, fail_rate=self.args.fail_rate, seed=self.args.seed
            )
            self.stoppers.append(recv.stop)
            say(f"    webhook receiver {recv.webhook_url}, SMTP catcher 127.0.0.1:{recv.smtp_port}")
        with self.sw.stage("endpoints + one effect that must dead-letter"):
            for line in database.register_endpoints(demo_db.url, recv, self.args.fail_rate):
                say(f"    {line}")
            key = database.enqueue_dead_letter(demo_db.url)
            say(f"    enqueued {key[:12]}… to {database.DEAD_LETTER_ENDPOINT}: its receiver")
            say("    answers 400, which is not retried, so it dead-letters on purpose")
        say(f"note: the demo's dispatchers allow {LOOPBACK} past the SSRF guard")
        say("      (OUTBOX_SSRF_ALLOW_NETWORKS), because its receivers run on loopback.")
        return demo_db, env, recv

    def run_spark_and_dispatch(
        self, spark: spark_stages.SparkStages, env: dict[str, str], engine: Engine
    ) -> None:
        crashing = self.args.crash
        if crashing:
            # The outbox fills first, so a dispatcher can be killed in the middle of a drain.
            spark.run_all(self.sw, self.crash_events)
        with self.sw.stage("dispatchers: start 2 replicas"):
            dispatchers = dispatch.Dispatchers(dispatcher_env(env), self.logs)
            self.stoppers.append(dispatchers.stop)
        if not crashing:
            # As in production: dispatchers deliver while Spark commits (woken by NOTIFY).
            spark.run_all(self.sw, None)
        with self.sw.stage("volume guard: the outsized day is held, then released"):
            self.held = guard.hold_and_release(engine, env, self.logs, spark.outsized_date)
        with self.sw.stage("dispatch: drain the outbox"):
            if crashing:
                crash.kill_a_dispatcher_mid_drain(engine, dispatchers, self.crash_events)
            dispatch.drain(engine, dispatchers, timeout_s=self.args.drain_timeout)
            codes = dispatchers.stop()
            say(f"    dispatchers stopped with SIGTERM, exit codes {codes}")


def _serve_until_interrupted(result: dict[str, Any], token: str) -> None:
    say("")
    say(f"support page: {result['support_url']}")
    say(f"sign in with this support token (shown once): {token}")
    say(f"API: {result['api_url']} (OpenAPI at {result['api_url']}/docs)")
    say("serving until Ctrl-C ...")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with contextlib.suppress(KeyboardInterrupt):
        while not stop.wait(0.5):
            pass
    say("stopping ...")
