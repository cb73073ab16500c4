"""The e-mail contract shared by enqueue, the sink and the SMTP channel."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.validation import check_email_effect

GOOD = {"subject": "Your invoice", "text": "Hello"}


@pytest.mark.parametrize(
    "recipient",
    ["ada@example.com", "a.b+tag@mail.example.co.uk", "x_y-1@sub-domain.example"],
)
def test_one_plain_address_is_accepted(recipient: str) -> None:
    assert check_email_effect(recipient, GOOD) == recipient


@pytest.mark.parametrize(
    "recipient",
    [
        None,
        "",
        "ada@example.com, eve@example.com",
        "ada@example.com;eve@example.com",
        "Ada <ada@example.com>",
        "ada@example.com\r\nBcc: eve@example.com",
        "ada @example.com",
        "ada@localhost",
        "@example.com",
        "ada@example.com\x00",
        42,
    ],
)
def test_anything_but_exactly_one_address_names_the_recipient_field(recipient: object) -> None:
    with pytest.raises(InvalidEffect) as info:
        check_email_effect(recipient, GOOD)
    assert info.value.field == "recipient" and "one" in info.value.fix


@given(st.text(min_size=1, max_size=40).filter(lambda s: any(c in s for c in ",;<> \t\r\n\x00")))
def test_a_recipient_carrying_a_separator_or_control_character_is_refused(text: str) -> None:
    with pytest.raises(InvalidEffect):
        check_email_effect(f"ada@example.com{text}", GOOD)


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"text": "x"}, "payload.subject"),
        ({"subject": " ", "text": "x"}, "payload.subject"),
        ({"subject": "a\r\nBcc: eve@example.com", "text": "x"}, "payload.subject"),
        ({"subject": "s" * 999, "text": "x"}, "payload.subject"),
        ({"subject": "s"}, "payload.text"),
        ({"subject": "s", "text": 3}, "payload.text"),
        ({"subject": "s", "text": "x", "html": ["<p>"]}, "payload.html"),
    ],
)
def test_payload_fields_are_checked_with_the_field_named(
    payload: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidEffect) as info:
        check_email_effect("ada@example.com", payload)
    assert info.value.field == field
