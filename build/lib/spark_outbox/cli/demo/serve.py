"""The API and the support page, with a freshly created support token."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from pathlib import Path

from spark_outbox.cli.demo import receivers
from spark_outbox.cli.demo.procs import Child, DemoFailed, tail, wait_until
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.console import tokens
from spark_outbox.core import db


def start_api(env: Mapping[str, str], log_dir: Path) -> tuple[Child, str]:
    """``outbox api serve`` on a free loopback port; returns it once /readyz answers."""
    port = free_port()
    # The page is served over plain http://127.0.0.1 to the person at this machine:
    # the session cookie must do without Secure (docs/api.md), said explicitly here.
    env = {**env, "OUTBOX_UI_INSECURE_COOKIE": "1"}
    child = Child("api", ["api", "serve", "--host", "127.0.0.1", "--port", str(port)], env, log_dir)
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if not child.running():
            raise DemoFailed(f"the API exited ({child.proc.returncode}):\n{tail(child.log_path)}")
        try:
            return bool(receivers.get_json(base + "/readyz"))
        except OSError:
            return False

    if not wait_until(ready, timeout_s=60, interval_s=0.3):
        child.stop()
        raise DemoFailed(f"the API did not become ready on {base}:\n{tail(child.log_path)}")
    return child, base


def support_token(url: str) -> str:
    """A new support-role token (shown once; stored hashed)."""
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            name = f"demo-support-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}"
            _, plaintext = tokens.create(conn, name=name, role="support")
    finally:
        engine.dispose()
    return plaintext
