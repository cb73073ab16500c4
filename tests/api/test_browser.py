"""End to end in headless Chromium: sign in, search a recipient, open the effect, see attempts.

Needs Debian's ``chromium`` (``make test`` installs it when run as root with
apt-get, via .ci/system-deps.sh); without it the test skips and says why.
Playwright drives the system browser: it never downloads one.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import TYPE_CHECKING

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.schema import rejects
from spark_outbox.core.settings import Breaker
from spark_outbox.dispatch import store
from tests.api.builders import add_attempt, add_batch, add_effect, story
from tests.api.conftest import Served, Tokens

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"]
# A page of 100 rows on a machine shared with other test suites: patience, not a flake.
PATIENT_MS = 30_000

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_support_finds_a_recipients_effect_and_its_attempts(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(
            f"{CHROMIUM} not found: install Debian's chromium (`apt-get install chromium`; "
            "`make test` does it when run as root)"
        )
    from playwright.sync_api import expect, sync_playwright

    built = story(engine)
    dead = built["dead"].key
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            context = browser.new_context(base_url=served.url)
            page = context.new_page()
            console: list[str] = []  # a CSP violation is reported here
            page.on("console", lambda message: console.append(message.text))
            page.goto("/ui")
            page.fill("#token", api_tokens.support)
            page.click("form.login button")
            expect(page.get_by_role("heading", name="Status")).to_be_visible()
            (cookie,) = context.cookies()
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

            page.fill("input[name=q]", "bob@example.com")
            page.press("input[name=q]", "Enter")
            expect(page.locator("table.results tbody tr")).to_have_count(2)
            page.click(f"a[href='/ui/effects/{dead}']")

            expect(page.locator("#effect-state")).to_have_text("dead")
            attempts = page.locator("#attempts li")
            expect(attempts).to_have_count(1)
            expect(attempts.first).to_contain_text("HTTP 400")
            expect(attempts.first).to_contain_text("bad field")
            expect(page.get_by_role("button", name="Requeue")).to_have_count(0)
            # The pages render under their CSP: nothing refused, the stylesheet applied.
            assert not [m for m in console if "Content Security Policy" in m], console
            assert page.locator("header").evaluate("e => getComputedStyle(e).display") == "flex"
            if shots := os.environ.get("OUTBOX_SCREENSHOTS"):  # look at what the test saw
                page.screenshot(path=f"{shots}/effect.png", full_page=True)
                page.goto("/ui")
                page.screenshot(path=f"{shots}/status.png", full_page=True)
        finally:
            browser.close()


def test_docs_render_offline_from_the_apps_own_assets(served: Served) -> None:
    """No request leaves the app (a CDN would be unreachable offline), the Swagger UI
    lists the API's operations, and nothing breaks the page's own CSP."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium")
    from playwright.sync_api import Route, expect, sync_playwright

    elsewhere: list[str] = []

    def offline(route: Route) -> None:
        if route.request.url.startswith(served.url):
            route.continue_()
        else:  # as without internet: the request fails
            elsewhere.append(route.request.url)
            route.abort()

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(base_url=served.url)
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            page.route("**/*", offline)
            page.goto("/docs")
            expect(page.locator(".swagger-ui .info .title")).to_contain_text("spark-outbox")
            expect(page.locator(".opblock-summary-path[data-path='/v1/rejects']")).to_have_count(1)
            assert elsewhere == []
            assert not [m for m in console if "Content Security Policy" in m], console
            if shots := os.environ.get("OUTBOX_SCREENSHOTS"):
                page.screenshot(path=f"{shots}/docs.png", full_page=False)
        finally:
            browser.close()


def test_status_chart_and_a_streaming_batch_page_in_the_browser(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    """The server-drawn chart shows the attempts of recent minutes, and a batch whose
    id holds '/', '#', '?' and a space opens from the search box and pages."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium")
    from playwright.sync_api import expect, sync_playwright

    batch_id = "stream-9/12 #a?b"
    with engine.begin() as conn:
        for i in range(3):
            effect = add_effect(conn, f"chart-{i}")
            add_attempt(conn, effect, "retry", status_code=503, minutes_ago=20)
            add_attempt(conn, effect, "delivered", status_code=200, minutes_ago=3)
        add_batch(conn, "billing", batch_id, [{"name": f"s-{i}"} for i in range(105)])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(base_url=served.url).new_page()
            page.goto("/ui")
            page.fill("#token", api_tokens.support)
            page.click("form.login button")
            chart = page.locator("svg#deliveries-chart")
            expect(chart).to_be_visible()
            expect(chart.locator("rect.delivered")).to_have_count(1)
            expect(chart.locator("rect.delivered")).to_have_attribute("data-count", "3")
            expect(chart.locator("rect.failed")).to_have_attribute("data-count", "3")
            assert chart.bounding_box()["width"] > 300  # type: ignore[index]

            page.fill("input[name=q]", f"billing/{batch_id}")
            page.press("input[name=q]", "Enter")
            expect(page.locator("#batch-id")).to_have_text(batch_id)
            expect(page.locator("#batch-effects tbody tr")).to_have_count(100)
            expect(page.locator("#reconcile-verdict")).to_contain_text("every row explained")
            page.click("#next-page")
            expect(page.locator("#batch-id")).to_have_text(batch_id)
            expect(page.locator("#batch-effects tbody tr")).to_have_count(5)
            if shots := os.environ.get("OUTBOX_SCREENSHOTS"):
                page.screenshot(path=f"{shots}/batch.png", full_page=True)
                page.goto("/ui")
                page.screenshot(path=f"{shots}/status-chart.png", full_page=True)
        finally:
            browser.close()


def test_support_walks_from_a_tile_to_a_list_to_an_effect_and_an_operator_resends_it(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    """The dead tile leads to the dead list (by endpoint, reasons grouped, pages with
    counts); a key's printed start opens its effect; the batch page lists its rejects;
    an operator's Resend button records a resend that support then sees."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium")
    from playwright.sync_api import expect, sync_playwright

    with engine.begin() as conn:
        dead = []
        for i in range(105):
            effect = add_effect(conn, f"dead-{i}", recipient=f"d{i}@example.com")
            add_attempt(conn, effect, "dead", status_code=400, error="HTTP 400: missing field")
            dead.append(effect.key)
        delivered = add_effect(conn, "delivered-1")
        add_attempt(conn, delivered, "delivered", status_code=200)
        add_batch(conn, "billing", "2026-11-29", [{"name": "b-1"}], rejects=3)
        for i in range(3):
            conn.execute(
                sa.insert(rejects).values(
                    job="billing",
                    batch_id="2026-11-29",
                    reason="recipient: is not one e-mail address; give one plain address",
                    raw_row={"row": i},
                )
            )
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(base_url=served.url).new_page()
            page.set_default_timeout(PATIENT_MS)
            console: list[str] = []
            page.on("console", lambda message: console.append(message.text))
            _sign_in(page, api_tokens.support)
            page.click("#tiles a.state-dead")
            expect(page.locator("h1")).to_have_text("Dead effects", timeout=PATIENT_MS)
            expect(page.locator("#showing")).to_have_text(
                "Showing 1–100 of 105", timeout=PATIENT_MS
            )
            expect(page.locator("#by-endpoint tbody tr")).to_have_count(1, timeout=PATIENT_MS)
            expect(page.locator("#reasons tbody tr").first).to_contain_text(
                "105", timeout=PATIENT_MS
            )
            page.click("#next-page")
            expect(page.locator("#showing")).to_have_text(
                "Showing 101–105 of 105", timeout=PATIENT_MS
            )
            expect(page.locator("#list-effects tbody tr")).to_have_count(5, timeout=PATIENT_MS)

            page.fill("input[name=q]", dead[0][:12] + "…")
            page.press("input[name=q]", "Enter")
            expect(page.locator("#effect-state")).to_have_text("dead", timeout=PATIENT_MS)
            expect(page.locator("#resend-form")).to_have_count(
                0, timeout=PATIENT_MS
            )  # support: no button

            page.fill("input[name=q]", "billing/2026-11-29")
            page.press("input[name=q]", "Enter")
            expect(page.locator("#reject-reasons tbody tr")).to_have_count(1, timeout=PATIENT_MS)
            expect(page.locator("#reject-reasons tbody tr").first).to_contain_text(
                "3", timeout=PATIENT_MS
            )
            expect(page.locator("#batch-rejects tbody tr")).to_have_count(3, timeout=PATIENT_MS)
            page.click("form.logout button >> nth=0")

            _sign_in(page, api_tokens.operator)
            page.goto(f"/ui/effects/{delivered.key}")
            page.fill("#resend-form input[name=reason]", "customer restored a backup")
            with page.expect_navigation(timeout=PATIENT_MS):  # the POST, then its redirect
                page.click("#resend-form button")
            expect(page.locator("#effect-state")).to_have_text("pending", timeout=PATIENT_MS)
            expect(page.locator("#effect-resend")).to_contain_text(
                "customer restored a backup", timeout=PATIENT_MS
            )
            assert not [m for m in console if "Content Security Policy" in m], console
            if shots := os.environ.get("OUTBOX_SCREENSHOTS"):
                page.goto("/ui/effects?state=dead")
                page.screenshot(path=f"{shots}/dead-list.png", full_page=True)
        finally:
            browser.close()


def _sign_in(page: Page, token: str) -> None:
    page.goto("/ui")
    page.fill("#token", token)
    page.click("form.login button")
    page.wait_for_selector("#tiles", timeout=PATIENT_MS)


def test_a_resting_endpoint_on_the_overview_and_its_rest_in_the_audit_trail(
    served: Served, api_tokens: Tokens, engine: Engine
) -> None:
    """What support sees when nothing is sent: the endpoint's state and why, then the
    system's rest in the audit trail, one click away from every page."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium (`apt-get install chromium`)")
    from playwright.sync_api import expect, sync_playwright

    _rest(engine, "billing-webhook")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(base_url=served.url).new_page()
            page.goto("/ui")
            page.fill("#token", api_tokens.support)
            page.click("form.login button")
            row = page.locator("#endpoints tr[data-endpoint='billing-webhook']")
            expect(row.locator("td.state")).to_have_text("resting")
            expect(row.locator("td.why")).to_contain_text("(circuit breaker) after 2 failed")
            expect(row.locator("td.streak")).to_contain_text("(last: HTTP 503)")
            if shots := os.environ.get("OUTBOX_SCREENSHOTS"):
                page.screenshot(path=f"{shots}/endpoints.png", full_page=True)
            page.click("header a.nav")
            expect(page.get_by_role("heading", name="Audit trail")).to_be_visible()
            page.click("#system-only")
            rows = page.locator("#audit tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("rest endpoint")
            expect(rows.first).to_contain_text("circuit breaker: 2 failed attempts in a row")
            if shots:
                page.screenshot(path=f"{shots}/audit.png", full_page=True)
        finally:
            browser.close()


def _rest(engine: Engine, endpoint: str) -> None:
    """Two failures recorded by the real record statement: the breaker rests it."""
    with engine.begin() as conn:
        for i in range(2):
            enqueue(conn, idempotency_key=effect_key("rest", i), endpoint=endpoint, payload={})
    now = dt.datetime.now(dt.UTC)
    results = [
        store.Result(c.id, c.lease_token, c.attempt, "retry", now, 1.0, 60.0, status_code=503)
        for c in store.claim(engine, "w", 2, 60)
    ]
    store.record(engine, "w", results, breaker=Breaker(failures=2, base_s=60.0))
