"""The demo's database and what it registers in it before any data flows.

Without ``DATABASE_URL`` every run gets a fresh ``outbox_demo`` database on
the private cluster, because the report counts everything in it. With
``DATABASE_URL`` the demo uses that database as it is, and refuses one that
already holds effects rather than mixing its numbers with someone else's.
"""

from __future__ import annotations

import dataclasses

from spark_outbox.cli.database import database_url
from spark_outbox.cli.demo import tally
from spark_outbox.cli.demo.procs import DemoFailed
from spark_outbox.cli.demo.receivers import Receivers
from spark_outbox.cli.tools import scratch
from spark_outbox.core import db, endpoints
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings

DEMO_DATABASE = "outbox_demo"
# Short, so retried deliveries finish within the demo (production: minutes to hours).
DEMO_RETRY_SCHEDULE_S = (0.0, 1.0, 2.0, 4.0)
DEAD_LETTER_ENDPOINT = "crm-legacy"


@dataclasses.dataclass(frozen=True)
class DemoDatabase:
    url: str
    server_url: str
    fresh: bool  # created by this run (and so safe to drop and recreate)

    def __repr__(self) -> str:
        """Both URLs with their passwords masked: a repr ends up in tracebacks."""
        return (
            f"DemoDatabase(url={db.redact(self.url)!r}, "
            f"server_url={db.redact(self.server_url)!r}, fresh={self.fresh})"
        )


def prepare(settings: Settings) -> DemoDatabase:
    if settings.database_url:
        url = settings.database_url
        db.upgrade(url, db.ALL_HEADS)
        engine = db.create_engine(url, pool_size=1)
        try:
            with engine.connect() as conn:
                if tally.effects_by_endpoint(conn):
                    raise DemoFailed(
                        f"{db.redact(url)} already holds effects; the demo's report counts "
                        "everything in its database. Point DATABASE_URL at a fresh database, "
                        "or unset it to use a private one."
                    )
        finally:
            engine.dispose()
        return DemoDatabase(url=url, server_url=url, fresh=False)
    server_url = database_url(settings)  # starts the private cluster when needed
    url = scratch.recreate_database(server_url, DEMO_DATABASE)
    db.upgrade(url, db.ALL_HEADS)
    return DemoDatabase(url=url, server_url=server_url, fresh=True)


def register_endpoints(url: str, recv: Receivers, fail_rate: float) -> list[str]:
    """The example job's endpoints, plus one whose receiver refuses every payload."""
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            endpoints.add_webhook(
                conn,
                name="billing-webhook",
                url=f"{recv.webhook_url}/hooks/billing",
                signing_secret=recv.signing_secret,
                retry_schedule_s=DEMO_RETRY_SCHEDULE_S,
                timeout_s=5,
            )
            endpoints.add_email(
                conn,
                name="billing-email",
                smtp_host="127.0.0.1",
                smtp_port=recv.smtp_port,
                mail_from="billing@demo.spark-outbox.invalid",
                retry_schedule_s=DEMO_RETRY_SCHEDULE_S,
                timeout_s=5,
                # The demo's mailcatcher drops repeated Message-IDs, so a send cut by
                # the --crash kill may be resent (docs/dispatcher.md, "Uncertain sends").
                deduplicates=True,
            )
            endpoints.add_webhook(
                conn,
                name=DEAD_LETTER_ENDPOINT,
                url=f"{recv.webhook_url}/reject",
                signing_secret=recv.signing_secret,
                retry_schedule_s=DEMO_RETRY_SCHEDULE_S,
                timeout_s=5,
            )
    finally:
        engine.dispose()
    return [
        f"billing-webhook -> {recv.webhook_url}/hooks/billing "
        f"(signed; {fail_rate:.0%} fail with 500)",
        f"billing-email   -> SMTP 127.0.0.1:{recv.smtp_port} ({fail_rate:.0%} fail with 451)",
        f"{DEAD_LETTER_ENDPOINT}      -> {recv.webhook_url}/reject (always answers 400)",
    ]


def enqueue_dead_letter(url: str) -> str:
    """One effect that must dead-letter: its receiver answers 400, which is not retried."""
    engine = db.create_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            result = enqueue(
                conn,
                idempotency_key=effect_key("crm.customer.sync", "demo-dead-letter"),
                endpoint=DEAD_LETTER_ENDPOINT,
                payload={"type": "crm.customer.sync", "customer_id": "C-DEMO", "note": "refused"},
            )
    finally:
        engine.dispose()
    return result.idempotency_key
