"""The shipped alert rules and Grafana dashboard (monitoring/): the rules pass
``promtool check rules`` and their unit tests (``promtool test rules``), every alert
has its runbook line in docs/operations.md, the dashboard's queries are valid PromQL,
and every metric and label the two name is one that a real dispatcher, the API and
``outbox verify`` export, scraped while they run (not a hand-kept list)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from tests import ROOT, promtool
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver

MONITORING = ROOT / "monitoring"
RULES = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "dashboard.json"
METRIC = re.compile(r"\b(outbox_[a-z_]+)\b(?:\{([^}]*)\})?")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
# What the issue asks the dashboard to show, by the metric that shows it.
DASHBOARD_MUST_SHOW = {
    "outbox_endpoint_queue_depth",  # queue depth per endpoint
    "outbox_endpoint_oldest_due_age_seconds",  # oldest due age per endpoint
    "outbox_deliveries_total",  # deliveries by outcome, dead letters
    "outbox_attempt_seconds_bucket",  # attempt latency
    "outbox_held_batches",
    "outbox_effects",  # uncertain effects, dead letters, every state
    "outbox_endpoint_state",  # breaker rests and automatic disables
    "outbox_verify_violations",  # verify results
}


@pytest.fixture(scope="module")
def promtool_found() -> None:
    if promtool.binary() is None:
        pytest.skip("promtool comes from Debian's prometheus package: needs apt-get, dpkg-deb")


def _alerts() -> list[dict[str, object]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def _dashboard_exprs() -> list[str]:
    """Every query of every panel, Grafana's variables given values Prometheus parses."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    return [e.replace("$__rate_interval", "5m").replace("$endpoint", ".*") for e in exprs]


def test_the_alert_rules_pass_promtool_check_and_their_unit_tests(promtool_found: None) -> None:
    checked = promtool.run("check", "rules", RULES.name, cwd=MONITORING)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(_alerts())} rules found" in checked.stdout
    tested = promtool.run("test", "rules", "alerts_test.yml", cwd=MONITORING)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    # every alert is tested, firing at least once
    fired = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\n\s+- ", _unit_tests()))
    assert fired == {str(a["alert"]) for a in _alerts()}


def _unit_tests() -> str:
    return (MONITORING / "alerts_test.yml").read_text()


def test_every_alert_has_its_runbook_line_in_the_operations_alert_table() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    table = doc[doc.index("### Alerts") :]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `(Outbox\w+)` \|(.*)$", table, re.M)}
    for alert in _alerts():
        name = str(alert["alert"])
        assert name in rows, f"{name} has no row in docs/operations.md's alert table"
        assert str(alert["annotations"]["runbook"]).endswith(f"({name})")  # type: ignore[index]
        assert len(rows[name].split("|")) >= 3 and rows[name].count("`") >= 2  # says what to run


def test_the_dashboard_queries_are_valid_promql(promtool_found: None, tmp_path: Path) -> None:
    """Each query as a recording rule: ``promtool check rules`` parses every one."""
    records = [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(_dashboard_exprs())]
    (tmp_path / "dashboard_rules.yml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": records}]})
    )
    checked = promtool.run("check", "rules", "dashboard_rules.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert len(records) >= 15


def _used(exprs: list[str]) -> dict[str, set[str]]:
    """Metric name -> the labels its matchers name, over all the expressions."""
    used: dict[str, set[str]] = {}
    for expr in exprs:
        for name, matchers in METRIC.findall(expr):
            used.setdefault(name, set()).update(MATCHER.findall(matchers))
    return used


def _exported(text: str) -> dict[str, set[str]]:
    """Sample name (what a query names: ``_total``, ``_bucket``) -> its labels."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


@pytest.fixture
def exported(engine: Engine, settings: Settings, db_url: str) -> dict[str, set[str]]:
    """What a dispatcher that delivered, the API and ``outbox verify`` serve, scraped."""
    receiver = Receiver()
    try:
        with engine.begin() as conn:
            add_webhook(conn, name="hook", url=receiver.url())
        procs.enqueue_many(engine, 3)
        found = _scrape_dispatcher(db_url, lambda: len(receiver.seen()) == 3)
    finally:
        receiver.close()
    with TestClient(create_app(settings)) as client:
        for name, labels in _exported(client.get("/metrics").text).items():
            found.setdefault(name, set()).update(labels)
    for name, labels in _scrape_verify(db_url).items():
        found.setdefault(name, set()).update(labels)
    return found


def _scrape_dispatcher(db_url: str, delivered: object) -> dict[str, set[str]]:
    port = free_port()
    proc = procs.start(procs.worker_env(db_url), "--metrics-port", str(port))
    try:
        procs.wait_for(delivered, 60, "3 deliveries")  # type: ignore[arg-type]
        procs.wait_for(lambda: _scraped(port) is not None, 30, "the dispatcher's /metrics")
        return _exported(_scraped(port) or "")
    finally:
        assert procs.stop(proc) == 0


def _scrape_verify(db_url: str) -> dict[str, set[str]]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_outbox",
            "verify",
            "--interval",
            "0.2",
            "--metrics-port",
            str(port),
        ],
        cwd=ROOT,
        env=procs.worker_env(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        ran = "outbox_verify_last_run_timestamp_seconds "
        procs.wait_for(lambda: ran in (_scraped(port) or ""), 30, "a verify pass")
        return _exported(_scraped(port) or "")
    finally:
        proc.terminate()
        proc.wait(10)


def _scraped(port: int) -> str | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
    except httpx.TransportError:
        return None


def _queries() -> Iterator[tuple[str, str]]:
    for alert in _alerts():
        yield f"alert {alert['alert']}", str(alert["expr"])
    for expr in _dashboard_exprs():
        yield "the dashboard", expr


def test_the_dashboard_and_alerts_name_only_metrics_and_labels_the_processes_export(
    exported: dict[str, set[str]],
) -> None:
    for where, expr in _queries():
        used = _used([expr])
        assert used, f"{where} names no outbox metric: {expr}"
        for name, labels in used.items():
            assert name in exported, f"{where} names {name}, which nothing exports"
            assert labels <= exported[name], f"{where}: {name} has no label {labels}"
        grouped = {g.strip() for m in GROUPING.findall(expr) for g in m.split(",")}
        available = set().union(*(exported[n] for n in used))
        assert grouped <= available, f"{where} groups by {grouped - available}: {expr}"
    shown = set(_used(_dashboard_exprs()))
    missing = DASHBOARD_MUST_SHOW - shown
    assert not missing, f"the dashboard shows nothing of {missing}"
