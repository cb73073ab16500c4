"""`outbox demo --no-serve` end to end at a small size: the report's numbers add up.

Runs the real command as a subprocess (every component its own process: Spark,
two dispatchers, receivers, API) against a fresh database, and checks the
machine-readable report it writes, never its text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, server_url: str, template_name: str) -> Any:
    from spark_outbox.cli.tools import scratch

    url = scratch.clone_template(server_url, template_name)
    tmp = tmp_path_factory.mktemp("demo")
    report_path = tmp / "report.json"
    try:
        result = subprocess.run(
            [sys.executable, "-m", "spark_outbox", "--log-format", "text", "demo", "--no-serve",
             "--customers", "50", "--events", "2000", "--seed", "7",
             "--batch-days", "1", "--stream-days", "2",
             "--report-json", str(report_path)],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": url, "OUTBOX_STATE_DIR": str(tmp / "state")},
            capture_output=True,
            text=True,
            timeout=540,  # ~1 min on a quiet machine; Spark slows down a lot under load
        )  # fmt: skip
    finally:
        scratch.drop_database(server_url, scratch.database_name(url))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(report_path.read_text()), result.stdout, report_path


def test_every_enqueued_effect_is_delivered_dead_or_pending(demo: Any) -> None:
    report, _, _ = demo
    e = report["effects"]
    assert e["enqueued"] > 0
    assert e["delivered"] + e["dead"] + e["pending"] + e["leased"] + e["cancelled"] == e["enqueued"]
    assert e["pending"] + e["leased"] == 0


def test_receivers_saw_each_delivered_effect_exactly_once(demo: Any) -> None:
    report, _, _ = demo
    hook, mail = report["endpoints"]["billing-webhook"], report["endpoints"]["billing-email"]
    assert hook["delivered"] > 0 and mail["delivered"] > 0
    assert report["receiver"]["unique"] == hook["delivered"]
    assert report["mailcatcher"]["unique"] == mail["delivered"]
    assert report["receiver"]["raw"] >= report["receiver"]["unique"]
    assert report["mailcatcher"]["raw"] >= report["mailcatcher"]["unique"]
    assert report["receiver"]["bad_signatures"] == 0
    assert report["reconciliation"]["unexplained"] == 0


def test_the_results_and_the_batches_agree(demo: Any) -> None:
    report, _, _ = demo
    jobs = {b["job"]: b for b in report["batches"]}
    assert jobs["billing"]["batches"] == 2  # one batch per billed day, and the outsized day
    assert jobs["billing.stream"]["batches"] >= 1  # the streaming query over arriving files
    assert report["result_rows"] > 0
    spark_effects = sum(b["effects_new"] for b in report["batches"])
    enqueued = report["endpoints"]
    assert (
        spark_effects
        == enqueued["billing-webhook"]["enqueued"] + enqueued["billing-email"]["enqueued"]
    )


def test_the_planted_failures_show_as_retries_a_dead_letter_and_rejects(demo: Any) -> None:
    report, _, _ = demo
    assert report["effects"]["retried"] > 0
    assert report["receiver"]["failed_on_purpose"] > 0
    assert report["effects"]["dead"] == 1
    (dead,) = report["dead_letters"]
    assert dead["endpoint"] == "crm-legacy"
    assert "400" in dead["last_error"]
    assert report["rejects"] > 0


def test_the_report_is_printed_timed_and_holds_no_secret(demo: Any) -> None:
    report, stdout, path = demo
    assert "final report" in stdout
    assert all(report["checks"].values()), report["checks"]
    assert {s["name"] for s in report["stages"]} >= {"dispatch: drain the outbox"}
    assert all(s["seconds"] >= 0 for s in report["stages"])
    text = Path(path).read_text()
    assert "obx_" not in text and "whsec_" not in text and "token" not in report


def test_the_volume_guard_held_the_outsized_day_until_its_release(demo: Any) -> None:
    report, stdout, _ = demo
    held = report["volume_guard"]
    assert held["held"] and "above 1.5x the median" in held["reason"]
    assert set(held["states_while_held"]) == {"pending"}
    assert held["released"] == sum(held["states_while_held"].values()) > 0
    assert "committed but held" in stdout and "released" in stdout
