"""E-mail deliveries over SMTP (smtplib in a thread: no extra dependency).

The ``Message-ID`` is derived from the idempotency key, so a mail system that
deduplicates on it sees one message however often we retry. The payload names
``subject`` and ``text`` (and optionally ``html``); the recipient is the
effect's ``recipient``. A missing field is a dead letter with the reason, not a crash.
"""

from __future__ import annotations

import asyncio
import functools
import json
import smtplib
import ssl
from email.message import EmailMessage

from dispatcher.channels import Sent, clip
from dispatcher.endpoints import Endpoint
from dispatcher.store import Claimed

MESSAGE_ID_DOMAIN = "spark-outbox"


def message_id(idempotency_key: str) -> str:
    return f"<{idempotency_key}@{MESSAGE_ID_DOMAIN}>"


def build_message(endpoint: Endpoint, effect: Claimed) -> EmailMessage | str:
    """The message, or the reason it cannot be built (a dead-letter reason)."""
    try:
        payload = json.loads(effect.payload)
    except ValueError:
        return "payload is not JSON"
    if not effect.recipient:
        return "recipient is missing: e-mail effects need a recipient address"
    subject, text = payload.get("subject"), payload.get("text")
    if not isinstance(subject, str) or not subject.strip():
        return "payload.subject is missing: e-mail payloads need a subject"
    if not isinstance(text, str):
        return "payload.text is missing: e-mail payloads need a text body"
    msg = EmailMessage()
    msg["Message-ID"] = message_id(effect.idempotency_key)
    msg["From"] = endpoint.mail_from or ""
    msg["To"] = effect.recipient
    msg["Subject"] = subject
    msg["Idempotency-Key"] = effect.idempotency_key
    msg.set_content(text)
    html = payload.get("html")
    if isinstance(html, str):
        msg.add_alternative(html, subtype="html")
    return msg


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying TLS context per process: building it costs ~10-90 ms."""
    return ssl.create_default_context()


def _send_sync(endpoint: Endpoint, msg: EmailMessage, timeout: float) -> None:
    host, port = endpoint.smtp_host or "", endpoint.smtp_port or 25
    context = _tls_context()
    smtp: smtplib.SMTP
    if endpoint.smtp_tls == "tls":
        smtp = smtplib.SMTP_SSL(host, port, timeout=timeout, context=context)
    else:
        smtp = smtplib.SMTP(host, port, timeout=timeout)
    with smtp:
        if endpoint.smtp_tls == "starttls":
            smtp.starttls(context=context)
        if endpoint.smtp_username:
            smtp.login(endpoint.smtp_username, endpoint.smtp_password or "")
        smtp.send_message(msg)


def _classify(exc: Exception) -> Sent:
    name = type(exc).__name__
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [code for code, _ in exc.recipients.values()]
        outcome = "retry" if codes and all(400 <= c < 500 for c in codes) else "dead"
        return Sent(
            outcome,
            status_code=codes[0] if codes else None,
            error_class=name,
            error=clip(f"recipient refused: {exc.recipients}", 500),
        )
    if isinstance(exc, smtplib.SMTPResponseException):
        outcome = "retry" if 400 <= exc.smtp_code < 500 else "dead"
        detail = (
            exc.smtp_error.decode("utf-8", "replace")
            if isinstance(exc.smtp_error, bytes)
            else str(exc.smtp_error)
        )
        return Sent(
            outcome,
            status_code=exc.smtp_code,
            error_class=name,
            error=clip(f"SMTP {exc.smtp_code}: {detail}", 500),
        )
    # Connection refused, timeouts, disconnects: transient.
    return Sent("retry", error_class=name, error=clip(str(exc) or name, 500))


class EmailChannel:
    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(self, endpoint: Endpoint, effect: Claimed, timeout_s: float) -> Sent:
        msg = build_message(endpoint, effect)
        if isinstance(msg, str):
            return Sent("dead", error_class="InvalidEmail", error=msg)
        try:
            await asyncio.to_thread(_send_sync, endpoint, msg, timeout_s)
        except (smtplib.SMTPException, OSError) as exc:
            return _classify(exc)
        return Sent("delivered", status_code=250)
