"""The SMTP catcher, run as `outbox mailcatcher serve`, over real SMTP and HTTP."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from typing import Any

import httpx
import pytest

from tests.demo.procs import outbox_process


def message(message_id: str, subject: str = "Your invoice") -> EmailMessage:
    msg = EmailMessage()
    msg["From"] = "billing@example.com"
    msg["To"] = "customer@example.com"
    msg["Subject"] = subject
    msg["Message-ID"] = message_id
    msg.set_content("Invoice INV-1: 12.50 EUR")
    return msg


def stats(info: dict[str, Any]) -> dict[str, int]:
    return httpx.get(info["url"] + "/stats", timeout=5).json()  # type: ignore[no-any-return]


def test_messages_are_caught_and_deduplicated_by_message_id() -> None:
    with outbox_process("mailcatcher", "serve", "--port", "0") as (_, info):
        with smtplib.SMTP(info["smtp_host"], info["smtp_port"], timeout=5) as smtp:
            smtp.send_message(message("<k1@outbox>"))
            smtp.send_message(message("<k1@outbox>"))  # a redelivery after a crash
            smtp.send_message(message("<k2@outbox>", subject="Another"))
        counts = stats(info)
        messages = httpx.get(info["url"] + "/messages", timeout=5).json()
    assert (counts["raw"], counts["unique"], counts["duplicates"]) == (3, 2, 1)
    assert [m["key"] for m in messages] == ["<k1@outbox>", "<k2@outbox>"]
    assert messages[0]["rcpt_tos"] == ["customer@example.com"]
    assert "INV-1" in messages[0]["body_excerpt"]


def test_a_failed_message_gets_a_transient_451() -> None:
    with outbox_process("mailcatcher", "serve", "--port", "0", "--fail-rate", "1") as (_, info):
        with (
            smtplib.SMTP(info["smtp_host"], info["smtp_port"], timeout=5) as smtp,
            pytest.raises(smtplib.SMTPDataError) as caught,
        ):
            smtp.send_message(message("<k3@outbox>"))
        counts = stats(info)
    assert caught.value.smtp_code == 451
    assert counts["failed_on_purpose"] == 1
    assert counts["raw"] == 0
