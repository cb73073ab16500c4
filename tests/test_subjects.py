"""An erasure's person: the selector checked field by field, and their value blanked
in text and JSON as a whole word only, whatever characters it holds."""

from __future__ import annotations

from spark_outbox.console.subjects import Person, person, redact, redact_json


def test_redact_blanks_whole_words_in_any_case_and_leaves_longer_words() -> None:
    text = "customer 42 asked (invoice 1427, order 42-A, C42)"
    assert redact(text, "42") == "customer [erased] asked (invoice 1427, order [erased]-A, C42)"
    assert redact("Ann.Lee@Example.com asked", "ann.lee@example.com") == "[erased] asked"


def test_redact_takes_the_value_literally_not_as_a_pattern() -> None:
    assert redact("a+b@x.com and aab@x.com", "a+b@x.com") == "[erased] and aab@x.com"
    assert redact("ids (1) and 1", "(1)") == "ids [erased] and 1"


def test_redact_json_blanks_keys_strings_and_equal_numbers_and_stays_json() -> None:
    document = {"filter": {"recipient": "ann@x.io"}, "ids": [42, 421, "42"], "ann@x.io": True}
    assert redact_json(document, "ann@x.io") == {
        "filter": {"recipient": "[erased]"},
        "ids": [42, 421, "42"],
        "[erased]": True,
    }
    assert redact_json(document, "42")["ids"] == ["[erased]", 421, "[erased]"]


def test_a_payload_field_is_split_at_the_first_equals_sign() -> None:
    assert person(payload_field="customer.token=a=b") == Person(
        payload_path="customer.token", payload_value="a=b"
    )
    assert person(payload_field="customer.id=42").params()["path"] == ["customer", "id"]
