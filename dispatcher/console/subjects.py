"""Who an erasure is about: one person, selected by one value, and that value
blanked where text quotes it (spark_outbox.console.erasure).

A person is their recipient, a business reference, or the value a payload field
holds (``customer.id=42``); ``person`` checks raw input (the CLI's options, the
API's body) and names the field at fault.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from spark_outbox.core.errors import InvalidRequest

ERASED = "[erased]"


@dataclasses.dataclass(frozen=True)
class Person:
    """Who is erased: exactly one of recipient, reference, or payload path and value."""

    recipient: str | None = None
    reference: str | None = None
    payload_path: str | None = None
    payload_value: str | None = None

    @property
    def by(self) -> str:
        if self.recipient is not None:
            return "recipient"
        return "reference" if self.reference is not None else f"payload {self.payload_path}"

    @property
    def value(self) -> str:
        return self.recipient or self.reference or self.payload_value or ""

    def params(self) -> dict[str, Any]:
        path = self.payload_path.split(".") if self.payload_path else None
        return {
            "recipient": self.recipient,
            "reference": self.reference,
            "path": path,
            "value": self.payload_value,
        }


def person(
    *,
    recipient: str | None = None,
    reference: str | None = None,
    payload_field: str | None = None,
) -> Person:
    """The selector from raw input; ``payload_field`` is ``path=value``."""
    given = [
        n
        for n, v in (
            ("recipient", recipient),
            ("reference", reference),
            ("payload_field", payload_field),
        )
        if v is not None
    ]
    if not given:
        raise InvalidRequest(
            "recipient",
            "no person selected",
            "give one of recipient, reference or payload_field (path=value, e.g. customer.id=42)",
        )
    if len(given) > 1:
        raise InvalidRequest(given[1], f"more than one selector ({', '.join(given)})", "give one")
    for name, value in (("recipient", recipient), ("reference", reference)):
        if value is not None:
            _check_value(name, value)
    if payload_field is None:
        return Person(recipient=recipient, reference=reference)
    path, sep, value = payload_field.partition("=")
    if not sep:
        raise InvalidRequest(
            "payload_field",
            f"{payload_field!r} has no '='",
            "write path=value, e.g. customer.id=42",
        )
    if not path or any(not part.strip() for part in path.split(".")) or "\x00" in path:
        raise InvalidRequest(
            "payload_field", f"path {path!r} is not a dotted path", "e.g. customer.id=42"
        )
    _check_value("payload_field", value)
    return Person(payload_path=path, payload_value=value)


def _check_value(field: str, value: str) -> None:
    if not value.strip():
        raise InvalidRequest(field, "is empty", "give the exact value to erase")
    if "\x00" in value:
        raise InvalidRequest(field, "contains a NUL character", "send plain text")


def redact(text: str, value: str) -> str:
    """``text`` with every whole-word occurrence of ``value`` (any case) blanked:
    ``42`` in "customer 42 asked" goes, in "invoice 1427" stays."""
    pattern = re.compile(rf"(?<![0-9A-Za-z]){re.escape(value)}(?![0-9A-Za-z])", re.IGNORECASE)
    return pattern.sub(ERASED, text)


def redact_json(document: Any, value: str) -> Any:
    """A JSON document with the value blanked in every key and string, and a number
    equal to it replaced: the structure stays valid JSON, whatever the value holds."""
    if isinstance(document, dict):
        return {redact(k, value): redact_json(v, value) for k, v in document.items()}
    if isinstance(document, list):
        return [redact_json(v, value) for v in document]
    if isinstance(document, str):
        return redact(document, value)
    if isinstance(document, int | float) and not isinstance(document, bool):
        return ERASED if str(document) == value else document
    return document
