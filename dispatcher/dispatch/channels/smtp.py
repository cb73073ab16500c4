"""E-mail deliveries over SMTP (aiosmtplib: async, STARTTLS, implicit TLS, AUTH).

The ``Message-ID`` is derived from the idempotency key, so a mail system that
deduplicates on it sees one message however often we retry. The effect must
meet the shared e-mail contract (``validation.check_email_effect``: exactly one
plain recipient address, a one-line subject, a text body); anything a channel
cannot render is one attempt, dead, with a reason naming the field and the fix.

Uncertain sends: the conversation is driven command by command (MAIL, RCPT,
DATA), so a failure after the DATA terminator was written and before any reply
is known as such (``Sent.handed_over``, docs/dispatcher.md "Uncertain sends").

Security: credentials never cross a plaintext connection unless the endpoint
opted in (``smtp_allow_plaintext_auth``). Time: one deadline for the whole send
(connect, TLS, AUTH, every command and reply), capped by the lease; smtplib's
timeout applied per socket operation, so a server that dripped its replies
could hold a send far past its lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.policy
import json
import logging
import re
import ssl
from email.message import EmailMessage
from pathlib import Path

import aiosmtplib

from spark_outbox.core import outside
from spark_outbox.core.endpoints import Endpoint
from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.settings import Settings
from spark_outbox.core.validation import check_email_effect
from spark_outbox.dispatch.channels import NOT_STARTED, Sent, Start, expired, past_send_by
from spark_outbox.dispatch.store import Claimed

log = logging.getLogger(__name__)

MESSAGE_ID_DOMAIN = "spark-outbox"
_WIRE = email.policy.SMTP  # CRLF line ends, RFC 2047 for non-ASCII headers
_LEADING_DOT = re.compile(rb"(?m)^\.")
QUIT_TIMEOUT_S = 1.0


# An e-mail carries its send span's context in headers of its own: a mail system
# gives ``traceparent`` no meaning, and these say whose they are.
TRACE_HEADERS = {"traceparent": "Outbox-Traceparent", "tracestate": "Outbox-Tracestate"}


def message_id(idempotency_key: str) -> str:
    return f"<{idempotency_key}@{MESSAGE_ID_DOMAIN}>"


def _invalid(field: str, problem: str, fix: str) -> Sent:
    return Sent("dead", error_class="InvalidEmail", error=f"{field}: {problem}; {fix}")


def render(endpoint: Endpoint, effect: Claimed) -> tuple[str, bytes] | Sent:
    """(recipient, the message's bytes), or a dead ``Sent`` saying which field to fix."""
    try:
        payload = json.loads(effect.payload)
    except ValueError:
        return _invalid("payload", "is not JSON", "enqueue a JSON object")
    if not isinstance(payload, dict):
        return _invalid("payload", "is not a JSON object", 'enqueue {"subject": .., "text": ..}')
    try:
        address = check_email_effect(effect.recipient, payload)
    except InvalidEffect as exc:
        return _invalid(exc.field, exc.problem, exc.fix)
    try:
        msg = EmailMessage(policy=_WIRE)
        msg["Message-ID"] = message_id(effect.idempotency_key)
        msg["From"] = endpoint.mail_from or ""
        msg["To"] = address
        msg["Subject"] = payload["subject"]
        msg["Idempotency-Key"] = effect.idempotency_key
        if effect.trace is not None:  # tracing on: the send span's W3C context
            for name, value in effect.trace.headers.items():
                msg[TRACE_HEADERS[name]] = value
        msg.set_content(payload["text"])
        if isinstance(payload.get("html"), str):
            msg.add_alternative(payload["html"], subtype="html")
        return address, msg.as_bytes()
    except Exception as exc:  # any failure to build is the effect's data
        return _invalid(
            "payload",
            f"cannot be rendered as an e-mail ({type(exc).__name__}: {exc})",
            "fix the subject, text or html so they are plain text and one-line where needed",
        )


def _classify(exc: BaseException, timeout_s: float) -> Sent:
    """Outcome and error class of a failed send (docs/dispatcher.md, outcome table)."""
    if isinstance(exc, TimeoutError):
        return Sent("retry", error_class="Timeout", error=f"no complete send in {timeout_s:.3g}s")
    if isinstance(exc, aiosmtplib.SMTPRecipientsRefused):
        codes = [r.code for r in exc.recipients]
        outcome = "retry" if codes and all(400 <= c < 500 for c in codes) else "dead"
        detail = "; ".join(f"{r.code} {r.message}" for r in exc.recipients)
        return Sent(
            outcome,
            status_code=codes[0] if codes else None,
            error_class="SMTPRecipientsRefused",
            error=f"recipient refused: {detail}",
        )
    if isinstance(exc, aiosmtplib.SMTPResponseException):
        outcome = "retry" if exc.code < 500 else "dead"
        return Sent(
            outcome,
            status_code=exc.code,
            error_class=type(exc).__name__,
            error=f"SMTP {exc.code}: {exc.message}",
        )
    if isinstance(exc, ssl.SSLError):
        return Sent("retry", error_class="TlsFailed", error=f"{type(exc).__name__}: {exc}")
    if isinstance(exc, aiosmtplib.SMTPException | OSError):
        return Sent("retry", error_class=type(exc).__name__, error=str(exc) or type(exc).__name__)
    log.error("unexpected send error", extra={"event": "send.unexpected"} | outside.failure(exc))
    return Sent("retry", error_class="Unexpected", error=f"{type(exc).__name__}: {exc}")


class EmailChannel:
    def __init__(self, settings: Settings) -> None:
        self._ca_file = settings.smtp_ca_file
        self._context: ssl.SSLContext | None = None

    def _tls_context(self) -> ssl.SSLContext:
        """One verifying TLS context per channel: building one costs ~10-90 ms."""
        if self._context is None:
            self._context = ssl.create_default_context()
            if self._ca_file:
                self._context.load_verify_locations(cafile=str(Path(self._ca_file)))
        return self._context

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def send(
        self, endpoint: Endpoint, effect: Claimed, timeout_s: float, start: Start | None = None
    ) -> Sent:
        """One message on a connection of its own; never raises for a delivery
        problem. ``start``: asked once DATA was accepted, right before the message's
        content goes out (connecting, TLS, AUTH, MAIL and RCPT hand nothing over:
        a send cut off there is not uncertain)."""
        rendered = render(endpoint, effect)
        if isinstance(rendered, Sent):
            return rendered
        plaintext = endpoint.smtp_tls == "none"
        if endpoint.smtp_username and plaintext and not endpoint.smtp_allow_plaintext_auth:
            return Sent(
                "dead",
                error_class="PlaintextAuthRefused",
                error="smtp_tls: 'none' would send the SMTP password unencrypted; use "
                "--smtp-tls starttls or tls (or opt in with --smtp-allow-plaintext-auth), "
                "then requeue",
            )
        recipient, data = rendered
        handed = _HandedOver()
        try:
            async with asyncio.timeout(timeout_s):
                client = await self._converse(
                    endpoint, effect, (recipient, data), timeout_s, handed, start
                )
        except _Expired:
            return expired("before the message's first byte (after the server said 354)")
        except _NotStarted:
            return Sent(NOT_STARTED)
        except Exception as exc:  # the server's doing, never the worker's end
            return dataclasses.replace(_classify(exc, timeout_s), handed_over=handed.done)
        with contextlib.suppress(Exception):  # accepted: a failed QUIT changes nothing
            await asyncio.wait_for(client.quit(), QUIT_TIMEOUT_S)
        client.close()
        return Sent("delivered", status_code=250)

    async def _converse(
        self,
        endpoint: Endpoint,
        effect: Claimed,
        message: tuple[str, bytes],
        timeout_s: float,
        handed: _HandedOver,
        start: Start | None,
    ) -> aiosmtplib.SMTP:
        """MAIL, RCPT, DATA driven step by step, so that ``handed`` says whether the
        whole message (up to the DATA terminator) was written and no answer came
        back: the server may then have accepted it. Returns the client after the 250.
        The envelope carries no part of the message: the send-by check comes right
        before the message's first byte (after 354), and a late one ends the
        conversation there (``_Expired``: the server drops an unfinished DATA)."""
        recipient, data = message
        plaintext = endpoint.smtp_tls == "none"
        client = aiosmtplib.SMTP(
            hostname=endpoint.smtp_host or "",
            port=endpoint.smtp_port or 25,
            username=endpoint.smtp_username,
            password=endpoint.smtp_password if endpoint.smtp_username else None,
            use_tls=endpoint.smtp_tls == "tls",
            start_tls=endpoint.smtp_tls == "starttls",
            tls_context=None if plaintext else self._tls_context(),
            timeout=timeout_s,
        )
        await client.connect()
        try:
            await client.mail(endpoint.mail_from or "")
            try:
                await client.rcpt(recipient)
            except aiosmtplib.SMTPRecipientRefused as exc:
                raise aiosmtplib.SMTPRecipientsRefused([exc]) from exc
            ready = await client.execute_command(b"DATA")
            if ready.code != 354:
                raise aiosmtplib.SMTPDataError(ready.code, ready.message)
            if past_send_by(effect):  # before a start is recorded for nothing
                raise _Expired
            if start is not None and not await start():
                raise _NotStarted  # closed below: the server drops the transaction
            if client.protocol is None:
                raise aiosmtplib.SMTPServerDisconnected("Connection lost")
            if past_send_by(effect):  # the message's first byte is next
                raise _Expired
            client.protocol.write(_data_section(data))
            handed.done = True
            answer = await client.protocol.read_response(timeout=timeout_s)
            handed.done = False  # an answer, whatever it says, is not an unknown outcome
            if answer.code != 250:
                raise aiosmtplib.SMTPDataError(answer.code, answer.message)
        except BaseException:
            client.close()
            raise
        return client


@dataclasses.dataclass
class _HandedOver:
    done: bool = False


class _Expired(Exception):
    """The send-by time came during the envelope: the message is not written."""


class _NotStarted(Exception):
    """The send's start could not be recorded: the message content never goes out."""


def _data_section(message: bytes) -> bytes:
    """The message as DATA carries it: CRLF line ends (the SMTP policy renders them),
    leading dots doubled (RFC 5321 4.5.2), then the terminator."""
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    return _LEADING_DOT.sub(b"..", message) + b".\r\n"
