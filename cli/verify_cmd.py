"""``outbox verify``: check the outbox's invariants, once (CI, after a drill) or for
as long as it runs (production, exported as metrics). dispatcher/console/verify.py
holds the checks; this is the loop, the log and the metrics."""

from __future__ import annotations

import argparse
import logging
import time
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    start_http_server,
)

from spark_outbox.cli import output
from spark_outbox.cli.database import engine_for
from spark_outbox.cli.filter_args import port
from spark_outbox.console import verify
from spark_outbox.core import revisions
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings

log = logging.getLogger("spark_outbox.verify")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check the outbox's invariants (once, or continuously with metrics)",
        description="Check the invariants of the outbox: "
        + "; ".join(c.invariant for c in verify.CHECKS.values())
        + ". Read-only. Exit 1 when --once finds a violation.",
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="read the whole history once, print what is found and exit (1 on a violation)",
    )
    p.add_argument("--interval", type=float, default=60.0, help="seconds between passes")
    p.add_argument(
        "--grace-s",
        type=float,
        default=300.0,
        help="how long past its expiry a lease may stay before it counts as a violation",
    )
    p.add_argument(
        "--settle-s",
        type=float,
        help="range checks read rows finished at least this long ago, so every transaction "
        "that wrote them has committed (default: 60; 0 with --once)",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=50_000,
        help="rows each range check reads per pass (the history is read once, in chunks)",
    )
    p.add_argument(
        "--metrics-port",
        type=port,
        help="serve /metrics on this port (default: none, no metrics server)",
    )
    p.add_argument("--metrics-host", default="127.0.0.1", help="address for --metrics-port")
    p.add_argument("--json", action="store_true", help="one JSON object per violation")
    p.set_defaults(handler=run)


class VerifyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.violations = Gauge(
            "outbox_verify_violations",
            "Rows breaking an invariant: for a state check, found by its latest pass; for "
            "a range check, found since the checker started",
            ["check"],
            registry=self.registry,
        )
        self.last_run = Gauge(
            "outbox_verify_last_run_timestamp_seconds",
            "When the latest pass of every check finished (Unix time)",
            registry=self.registry,
        )
        self.duration = Gauge(
            "outbox_verify_pass_seconds", "How long the latest pass took", registry=self.registry
        )
        self.rows = Counter(
            "outbox_verify_rows_checked",
            "Rows read by the range checks (effects, finished, markers)",
            ["range"],
            registry=self.registry,
        )
        self.caught_up = Gauge(
            "outbox_verify_caught_up",
            "1 once the range checks have read the whole history",
            registry=self.registry,
        )
        for name in verify.CHECKS:
            self.violations.labels(name).set(0)

    def observe(self, checker: verify.Checker, report: verify.PassReport, took: float) -> None:
        for name, n in checker.counts.items():
            self.violations.labels(name).set(n)
        for name, n in report.checked.items():
            self.rows.labels(name).inc(n)
        self.caught_up.set(1 if report.caught_up else 0)
        self.duration.set(took)
        self.last_run.set(time.time())


def run(args: argparse.Namespace, settings: Settings) -> int:
    if not args.interval > 0:
        raise ConfigurationError(f"--interval must be > 0 seconds, got {args.interval}")
    try:
        settle_s = args.settle_s if args.settle_s is not None else (0.0 if args.once else 60.0)
        checker = verify.Checker(grace_s=args.grace_s, settle_s=settle_s, chunk=args.chunk)
    except ValueError as exc:
        raise ConfigurationError(f"--{str(exc).replace('_', '-')}") from None
    engine = engine_for(settings)
    try:
        revisions.require_usable(engine, "outbox verify")  # its checks read this release's columns
        if args.once:
            with engine.connect() as conn:
                report = checker.run_until_current(conn)
            _print(report.violations, args.json)
            checked = ", ".join(f"{k} {v}" for k, v in sorted(report.checked.items()))
            verdict = "no violation" if report.ok else f"{len(report.violations)} violation(s)"
            print(f"verify: {verdict} ({checked} row(s) read)")
            return 0 if report.ok else 1
        return _forever(engine, checker, args)
    finally:
        engine.dispose()


def _forever(engine: Any, checker: verify.Checker, args: argparse.Namespace) -> int:
    disable_created_metrics()  # this process's own: no *_created series beside the counts
    metrics = VerifyMetrics()
    if args.metrics_port:
        try:
            start_http_server(args.metrics_port, addr=args.metrics_host, registry=metrics.registry)
        except OSError as exc:
            raise ConfigurationError(
                f"--metrics-port {args.metrics_port}: cannot listen on {args.metrics_host}:"
                f"{args.metrics_port} ({exc.strerror or exc}); pick a free port"
            ) from None
    log.info("verify: checking every %.0f s", args.interval)
    while True:
        started = time.monotonic()
        try:
            with engine.connect() as conn:
                report = checker.run_pass(conn)
        except Exception as exc:  # a database restart must not end the checker
            log.warning("verify: pass failed, retrying next interval: %s", exc.__class__.__name__)
        else:
            metrics.observe(checker, report, time.monotonic() - started)
            for line in verify.render(report.violations):
                log.error("verify: %s", line)
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


def _print(violations: list[verify.Violation], as_json: bool) -> None:
    if as_json:
        for v in violations:
            print(output.dumps(v.as_dict()))
    else:
        for line in verify.render(violations):
            print(line)
