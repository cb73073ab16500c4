"""What the support role sees: sensitive payload fields, and outside text that echoes them.

The rules (docs/api.md, "Masking for the support role"):

1. Payload: each dotted path in ``OUTBOX_SENSITIVE_FIELDS`` is shown as ``***``;
   a path through a list masks the field in every element; absent paths are
   ignored.
2. Text that came from outside (a response excerpt, an attempt's error, the
   effect's ``last_error``) may echo the payload back, so
   a. a JSON document in it (an excerpt's body after its header block, or the
      whole text) is masked field by field with the same paths;
   b. then every value those paths hold in the effect's own payload (each string
      or number under a masked path, as written and as JSON escapes it) is
      replaced by ``***`` wherever it appears, case-insensitively (``echoes``).
      That catches prose ("card 4111... declined") and a clipped body that no
      longer parses. A value of 6 characters or more (separators aside) is found
      with spaces, dashes or dots between its characters, as receivers group a
      card number (``4111 1111 1111 1111``); values of 1 to 3 characters are
      masked only as whole words: a substring match would erase unrelated text
      while hiding little. A text clipped in the middle of a value (excerpts are
      cut at 2 KiB) ends with the value's first characters: from 4 on, they are
      masked too.

3. A URL (an endpoint's, in the operators' audit trail, or any ``http(s)://`` in
   outside text) keeps its scheme, host, port and the path segments that read as
   plain words (lowercase words of up to 12 letters, joined by ``-`` or ``_``, and
   versions such as ``v2``); every other segment (``T000``, a token, an id), the
   user and password, every query value and the fragment become ``***``
   (``masked_url``). Receivers put their secret in the path as often as in the
   query (``/services/T000/B000/<token>``).

E-mail addresses as such are not masked: the recipient is shown to support by
design (it is what they search by); list ``customer.email`` to mask it where the
payload carries it.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator, Sequence
from typing import Any, overload
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from spark_outbox.core import echoes

MASK = "***"
_SHORT = echoes.SHORT  # values shorter than this are masked as whole words only


@overload
def mask_payload(payload: dict[str, Any], paths: Sequence[str]) -> dict[str, Any]: ...
@overload
def mask_payload(payload: None, paths: Sequence[str]) -> None: ...
def mask_payload(payload: dict[str, Any] | None, paths: Sequence[str]) -> dict[str, Any] | None:
    """A copy of the payload with each dotted path's value replaced by ``***``
    (None stays None: retention purged it)."""
    if payload is None:
        return None
    masked: dict[str, Any] = _masked_copy(payload, paths)
    return masked


def _masked_copy(document: Any, paths: Sequence[str]) -> Any:
    masked = copy.deepcopy(document)
    for path in paths:
        _mask(masked, path.split("."))
    return masked


def _mask(node: Any, parts: list[str]) -> None:
    if isinstance(node, list):
        for item in node:
            _mask(item, parts)
        return
    if not isinstance(node, dict) or parts[0] not in node:
        return
    if len(parts) == 1:
        node[parts[0]] = MASK
    else:
        _mask(node[parts[0]], parts[1:])


def masked_values(payload: dict[str, Any] | None, paths: Sequence[str]) -> tuple[str, ...]:
    """The texts of the values that ``paths`` mask in ``payload`` (rule 2b's needles)."""
    found: set[str] = set()
    if payload is None:
        return ()
    for path in paths:
        for value in _at(payload, path.split(".")):
            for leaf in _leaves(value):
                found.update({leaf, json.dumps(leaf)[1:-1]})
    found.discard("")
    return tuple(sorted(found, key=len, reverse=True))


def _at(node: Any, parts: list[str]) -> Iterator[Any]:
    if isinstance(node, list):
        for item in node:
            yield from _at(item, parts)
    elif isinstance(node, dict) and parts[0] in node:
        if len(parts) == 1:
            yield node[parts[0]]
        else:
            yield from _at(node[parts[0]], parts[1:])


def _leaves(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif isinstance(value, str):
        yield value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield json.dumps(value)


def mask_text(text: str | None, paths: Sequence[str], values: Sequence[str]) -> str | None:
    """Outside text with rule 2 applied (``values`` from ``masked_values``)."""
    if not text or not paths:
        return text
    text = mask_urls(_mask_json(text, paths))
    if not values:
        return text
    return echoes.masked(text, values, MASK)


def _mask_json(text: str, paths: Sequence[str]) -> str:
    """Rule 2a: the JSON body after an excerpt's header block, or the whole text."""
    head, blank, body = text.partition("\n\n")
    candidates = [(head + blank, body)] if blank else []
    candidates.append(("", text))
    for before, document in candidates:
        try:
            parsed = json.loads(document)
        except ValueError:
            continue
        if isinstance(parsed, dict | list):
            return before + json.dumps(_masked_copy(parsed, paths), ensure_ascii=False)
    return text


_WORD = re.compile(r"[a-z]{1,12}(?:[-_][a-z]{1,12})*|v[0-9]{1,2}")
_URL = re.compile(r"https?://[^\s\"'<>]+", re.IGNORECASE)


def masked_url(url: str | None) -> str | None:
    """Rule 3: the URL with what may be a secret replaced by ``***``."""
    if not url:
        return url
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    netloc = f"{MASK}@{host}" if "@" in parts.netloc else host
    path = "/".join(s if not s or _WORD.fullmatch(s) else MASK for s in parts.path.split("/"))
    query = urlencode([(k, MASK) for k, _ in parse_qsl(parts.query, keep_blank_values=True)])
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def mask_urls(text: str) -> str:
    """Every ``http(s)://`` URL in outside text, masked by rule 3."""
    return _URL.sub(lambda m: masked_url(m.group(0)) or "", text)
