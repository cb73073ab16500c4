"""The SMTP catcher: the other end of the dispatcher's e-mail channel.

An SMTP server (aiosmtpd) that accepts every message, deduplicates on
``Message-ID`` (the dispatcher derives it from the idempotency key) and counts
raw and unique messages, plus a small HTTP side (``GET /stats``,
``GET /messages?limit=N``, ``GET /healthz``) so a person, a test or the demo
can read what arrived. ``fail_rate`` answers a deterministic fraction of
messages with a transient ``451`` so retries show, as the webhook receiver's
500s do.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email
import email.policy
import hashlib
import logging
from typing import Any

from aiohttp import web
from aiosmtpd.smtp import SMTP

from spark_outbox.cli.tools.receipts import ReceiptLog
from spark_outbox.cli.tools.receiver import bind

log = logging.getLogger(__name__)

LOG_KEY: web.AppKey[ReceiptLog] = web.AppKey("receipt_log", ReceiptLog)
_BODY_EXCERPT_CHARS = 2000


class CatchingHandler:
    """aiosmtpd handler: every DATA command lands here."""

    def __init__(self, receipts: ReceiptLog) -> None:
        self.receipts = receipts

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.receipts.count("requests")
        content: bytes = envelope.original_content or envelope.content or b""
        message = email.message_from_bytes(content, policy=email.policy.default)
        message_id = str(message.get("Message-ID") or "").strip()
        if not message_id:
            self.receipts.count("missing_message_id")
            message_id = "no-message-id:" + hashlib.sha256(content).hexdigest()
        if self.receipts.attempt(message_id):
            return "451 4.3.0 failed on purpose (--fail-rate), try again later"
        self.receipts.accept(message_id, _summary(message, envelope, len(content)))
        return "250 OK message accepted"


def _summary(message: Any, envelope: Any, size: int) -> dict[str, Any]:
    body = message.get_body(preferencelist=("plain", "html"))
    text = body.get_content() if body is not None else ""
    return {
        "mail_from": envelope.mail_from,
        "rcpt_tos": list(envelope.rcpt_tos),
        "subject": str(message.get("Subject") or ""),
        "idempotency_key_header": message.get("Idempotency-Key"),
        "size_bytes": size,
        "received_at": dt.datetime.now(dt.UTC).isoformat(),
        "body_excerpt": text[:_BODY_EXCERPT_CHARS],
    }


def create_stats_app(receipts: ReceiptLog) -> web.Application:
    app = web.Application()
    app[LOG_KEY] = receipts
    app.router.add_get("/stats", _stats)
    app.router.add_get("/messages", _messages)
    app.router.add_get("/healthz", _healthz)
    return app


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[LOG_KEY].stats())


async def _messages(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        return web.json_response({"error": "limit: give an integer, e.g. 100"}, status=400)
    return web.json_response(request.app[LOG_KEY].receipts(limit))


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def start_smtp(
    receipts: ReceiptLog, host: str, port: int
) -> tuple[asyncio.AbstractServer, int]:
    """Start the SMTP side; returns the server (to close) and the bound port."""
    loop = asyncio.get_running_loop()
    handler = CatchingHandler(receipts)
    sock = bind(host, port)
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="outbox-mailcatcher", enable_SMTPUTF8=True, loop=loop),
        sock=sock,
    )
    return server, int(sock.getsockname()[1])
