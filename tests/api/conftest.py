"""API fixtures: the real app (create_app) on a fresh database, tokens of both roles."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from spark_outbox.api.app import create_app
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.console import tokens
from spark_outbox.core.settings import Settings
from tests.conftest import insert_billing_endpoints
from tests.dispatcher.conftest import receiver  # noqa: F401  (the same fixture here)
from tests.otlp import otlp  # noqa: F401  (tracing to a receiver on loopback)


@dataclasses.dataclass(frozen=True)
class Tokens:
    support: str
    operator: str

    def auth(self, role: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {getattr(self, role)}"}


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    return dataclasses.replace(settings, sensitive_fields=("card.pan",))


@pytest.fixture
def endpoints(engine: Engine) -> None:
    insert_billing_endpoints(engine, smtp_password="hunter2-smtp")


@pytest.fixture
def api_tokens(engine: Engine) -> Tokens:
    with engine.begin() as conn:
        _, support = tokens.create(conn, name="sam", role="support")
        _, operator = tokens.create(conn, name="olga", role="operator")
    return Tokens(support=support, operator=operator)


@pytest.fixture
def client(api_settings: Settings, endpoints: None) -> Iterator[TestClient]:
    """The app over HTTPS, as deployed: the support page's cookies are Secure."""
    with TestClient(create_app(api_settings), base_url="https://testserver") as test_client:
        yield test_client


def window(days: int = 1) -> dict[str, str]:
    """A since/until pair around now, as query parameters."""
    now = dt.datetime.now(dt.UTC)
    return {
        "since": (now - dt.timedelta(days=days)).isoformat(),
        "until": (now + dt.timedelta(minutes=5)).isoformat(),
    }


@dataclasses.dataclass
class Served:
    """``outbox api serve`` running in a subprocess on a free loopback port."""

    url: str
    proc: subprocess.Popen[str]

    def stop(self) -> int:
        """SIGTERM, as a supervisor would; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def served(api_settings: Settings, endpoints: None, tmp_path: Path) -> Iterator[Served]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": api_settings.database_url,
        "OUTBOX_SENSITIVE_FIELDS": ",".join(api_settings.sensitive_fields),
        # Plain http://127.0.0.1, as the demo serves it to a browser.
        "OUTBOX_UI_INSECURE_COOKIE": "1",
    }
    log = (tmp_path / "api.log").open("w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spark_outbox",
            "--log-format",
            "text",
            "api",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    server = Served(url=f"http://127.0.0.1:{port}", proc=proc)
    deadline = time.monotonic() + 60  # a loaded CI machine imports slowly
    while True:
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            log.close()
            raise AssertionError(f"api did not start: {(tmp_path / 'api.log').read_text()}")
        time.sleep(0.1)
    yield server
    server.stop()
    log.close()
