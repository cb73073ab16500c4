"""The status chart: the SVG's bars match the counts (pure), and the counts match the
attempts in the database (real PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import xml.etree.ElementTree as ET

from sqlalchemy.engine import Engine

from spark_outbox.api.chart import BOTTOM, HEIGHT, LEFT, TOP, WIDTH, svg
from spark_outbox.console import health
from tests.api.builders import add_attempt, add_effect
from tests.conftest import insert_billing_endpoints

NS = {"s": "http://www.w3.org/2000/svg"}
START = dt.datetime(2026, 11, 23, 12, 0, tzinfo=dt.UTC)


def _at(minute: int) -> dt.datetime:
    return START + dt.timedelta(minutes=minute)


def _bars(root: ET.Element, kind: str) -> list[dict[str, str]]:
    return [r.attrib for r in root.findall(f"s:rect[@class='{kind}']", NS)]


def test_bars_stand_for_the_counts_of_their_minute() -> None:
    activity = health.Activity(
        start=START,
        minutes=61,
        points=[
            health.Minute(_at(5), delivered=10, failed=0),
            health.Minute(_at(6), delivered=5, failed=5),
            health.Minute(_at(30), delivered=0, failed=2),
        ],
    )
    root = ET.fromstring(str(svg(activity)))  # noqa: S314  (our own markup)
    plot_h = HEIGHT - BOTTOM - TOP
    base = HEIGHT - BOTTOM
    delivered, failed = _bars(root, "delivered"), _bars(root, "failed")
    assert [(b["data-minute"], b["data-count"]) for b in delivered] == [
        ("2026-11-23T12:05Z", "10"),
        ("2026-11-23T12:06Z", "5"),
    ]
    assert [(b["data-minute"], b["data-count"]) for b in failed] == [
        ("2026-11-23T12:06Z", "5"),
        ("2026-11-23T12:30Z", "2"),
    ]
    assert root.attrib["data-peak"] == "10"  # the tallest column fills the plot
    assert float(delivered[0]["height"]) == plot_h
    assert float(delivered[1]["height"]) == plot_h / 2 == float(failed[0]["height"])
    # Failures stack on the delivered bar of the same minute; every bar sits on the base.
    assert float(failed[0]["y"]) + float(failed[0]["height"]) == float(delivered[1]["y"])
    assert float(delivered[1]["y"]) + float(delivered[1]["height"]) == base
    xs = [float(b["x"]) for b in (delivered[0], delivered[1], failed[1])]
    step = (WIDTH - LEFT) / 61  # one minute
    assert abs(float(delivered[0]["width"]) - step) < 0.01
    assert abs((xs[1] - xs[0]) - step) < 0.02  # adjacent minutes
    assert abs((xs[2] - xs[0]) - 25 * step) < 0.02  # 12:30 is 25 minutes after 12:05


def test_a_quiet_window_draws_no_bar() -> None:
    quiet = health.Activity(start=START, minutes=361, points=[])
    root = ET.fromstring(str(svg(quiet)))  # noqa: S314  (our own markup)
    assert root.findall("s:rect", NS) == [] and root.attrib["data-peak"] == "0"


def test_the_counts_come_from_the_attempts_of_the_window(engine: Engine) -> None:
    insert_billing_endpoints(engine)
    with engine.begin() as conn:
        for i in range(3):
            effect = add_effect(conn, f"e-{i}")
            add_attempt(conn, effect, "retry", status_code=503, minutes_ago=12)
            add_attempt(conn, effect, "delivered", status_code=200, minutes_ago=2)
        old = add_effect(conn, "old")
        add_attempt(conn, old, "delivered", status_code=200, minutes_ago=7 * 60)  # outside 6 h
        activity = health.activity(conn, hours=6)
    assert activity.minutes == 361
    assert sorted((p.delivered, p.failed) for p in activity.points) == [(0, 3), (3, 0)]
    assert all(p.minute >= activity.start for p in activity.points)
