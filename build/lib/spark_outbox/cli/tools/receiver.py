"""The reference webhook receiver: the other end of the dispatcher's webhook channel.

It does what the guarantee asks of a receiver: verify the Standard Webhooks
signature (``webhook-id``, ``webhook-timestamp``, ``webhook-signature``) and
deduplicate on ``webhook-id`` (the effect's idempotency key). It counts raw and
unique receipts, so "delivered at least once, processed exactly once" can be
checked, and it can fail a fraction of deliveries with 500 (deterministically
by seed) so retries show. Users run it (``outbox receiver serve``) to try
their own integration locally; the demo and the tests run it to check the
dispatcher against a real HTTP server.

Routes: ``POST /<any path>`` receives; a path ending in ``/reject`` always
answers 400 (a receiver that refuses the payload: the effect dead-letters);
``GET /stats`` the counts as JSON; ``GET /receipts?limit=N`` the latest first
receipts; ``GET /healthz``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import socket

from aiohttp import web
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from spark_outbox.cli.tools.receipts import ReceiptLog

log = logging.getLogger(__name__)

LOG_KEY: web.AppKey[ReceiptLog] = web.AppKey("receipt_log", ReceiptLog)
VERIFIER_KEY: web.AppKey[Webhook] = web.AppKey("verifier", Webhook)


def create_app(secret: str, receipts: ReceiptLog) -> web.Application:
    """The receiver's aiohttp application, verifying with ``secret`` (``whsec_...``)."""
    app = web.Application(client_max_size=4 * 1024 * 1024)
    app[LOG_KEY] = receipts
    app[VERIFIER_KEY] = Webhook(secret)
    app.router.add_get("/stats", _stats)
    app.router.add_get("/receipts", _receipts)
    app.router.add_get("/healthz", _healthz)
    app.router.add_post("/{tail:.*}", _receive)
    return app


async def _receive(request: web.Request) -> web.Response:
    receipts = request.app[LOG_KEY]
    receipts.count("requests")
    body = await request.read()
    try:
        payload = request.app[VERIFIER_KEY].verify(body, dict(request.headers))
    except (WebhookVerificationError, ValueError, UnicodeDecodeError) as exc:
        receipts.count("bad_signatures")
        log.warning("bad signature", extra={"event": "receiver.bad_signature", "reason": str(exc)})
        return web.json_response({"error": "signature verification failed"}, status=401)
    key = request.headers["webhook-id"]
    if request.path.rstrip("/").endswith("/reject"):
        receipts.count("rejected")
        return web.json_response(
            {"error": "this endpoint refuses every payload (reference receiver /reject)"},
            status=400,
        )
    if receipts.attempt(key):
        return web.json_response({"error": "failed on purpose (--fail-rate)"}, status=500)
    new = receipts.accept(
        key,
        {
            "path": request.path,
            "webhook_timestamp": request.headers.get("webhook-timestamp"),
            "idempotency_key_header": request.headers.get("Idempotency-Key"),
            "received_at": dt.datetime.now(dt.UTC).isoformat(),
            "payload": payload,
        },
    )
    return web.json_response({"received": True, "duplicate": not new})


async def _stats(request: web.Request) -> web.Response:
    return web.json_response(request.app[LOG_KEY].stats())


async def _receipts(request: web.Request) -> web.Response:
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        return web.json_response({"error": "limit: give an integer, e.g. 100"}, status=400)
    return web.json_response(request.app[LOG_KEY].receipts(limit), dumps=_dumps)


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def _dumps(value: object) -> str:
    return json.dumps(value, default=str)


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving ``app``; returns the runner (to clean up) and the bound port.

    The socket is bound here, so ``port=0`` picks a free port without a race.
    """
    sock = bind(host, port)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner, int(sock.getsockname()[1])


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: any free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio sets TCP_NODELAY on accepted sockets only when
    # it is explicit, and without it a multi-line reply (SMTP EHLO) waits ~40 ms for
    # the client's delayed ACK (Nagle).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(512)
    sock.setblocking(False)
    return sock
