"""The demo's reference receivers: a webhook receiver and an SMTP catcher on loopback.

They fail a small, deterministic fraction of deliveries (500 and 451) so the
report shows retries, and count raw and unique receipts so it can show that
every effect was processed exactly once on the receiving side.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spark_outbox.cli.demo.procs import Child
from spark_outbox.cli.receiver_cmd import SECRET_ENV
from spark_outbox.core.endpoints import generate_signing_secret


@dataclasses.dataclass
class Receivers:
    webhook: Child
    webhook_url: str
    signing_secret: str = dataclasses.field(repr=False)
    catcher: Child
    smtp_port: int
    catcher_url: str

    def stop(self) -> None:
        for child in (self.webhook, self.catcher):
            child.stop(timeout_s=10)


def start(env: Mapping[str, str], log_dir: Path, *, fail_rate: float, seed: int) -> Receivers:
    secret = generate_signing_secret()
    common = ["--port", "0", "--fail-rate", str(fail_rate), "--seed", str(seed)]
    webhook = Child(
        "receiver",
        ["receiver", "serve", *common, "--jsonl", str(log_dir / "webhook-receipts.jsonl")],
        {**env, SECRET_ENV: secret},
        log_dir,
        announces=True,
    )
    catcher = Child(
        "mailcatcher",
        ["mailcatcher", "serve", *common, "--jsonl", str(log_dir / "mail-receipts.jsonl")],
        env,
        log_dir,
        announces=True,
    )
    w, c = webhook.announced(), catcher.announced()
    return Receivers(
        webhook=webhook,
        webhook_url=str(w["url"]),
        signing_secret=secret,
        catcher=catcher,
        smtp_port=int(c["smtp_port"]),
        catcher_url=str(c["url"]),
    )


def get_json(url: str) -> Any:
    """GET a loopback URL this demo built itself (never user input)."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"the demo only reads its own loopback services, not {url!r}")
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310  (checked above)
        return json.loads(resp.read())


def stats(base_url: str) -> dict[str, int]:
    return {k: int(v) for k, v in get_json(base_url + "/stats").items()}


def unique_keys(base_url: str, path: str = "/receipts") -> set[str]:
    """Every key the receiver accepted at least once."""
    return {str(r["key"]) for r in get_json(f"{base_url}{path}?limit=10000000")}
