"""Text from outside, made safe once: the one function every such text passes
before it can reach SQL or a log line.

A receiver's status line, headers and body, an SMTP server's reply, and the
message of an exception that quotes either are hostile data. PostgreSQL's
``text`` refuses NUL and invalid UTF-8 (one such row used to fail the whole
batched ``record`` and stop the worker), a CR or an escape sequence can forge a
log line, and an endless answer must not fill memory. ``clean`` turns any of
it into bounded, valid UTF-8 that keeps what a support person needs to read.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

# What a delivery attempt keeps of a receiver's answer, and of an error message.
EXCERPT_CHARS = 2048
EXCERPT_BYTES = 2048
ERROR_CHARS = 500
ERROR_BYTES = 1000
CLASS_CHARS = 100

# C0 and C1 control characters (and DEL) except \t and \n; NUL is one of them.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _escape(match: re.Match[str]) -> str:
    return f"\\x{ord(match.group()):02x}"


def clean(
    value: str | bytes | None, max_chars: int = ERROR_CHARS, max_bytes: int = ERROR_BYTES
) -> str | None:
    """``value`` as valid UTF-8 with control characters escaped (``\\x00``; ``\\n``
    and ``\\t`` kept), invalid bytes and lone surrogates replaced by U+FFFD, cut to
    at most ``max_chars`` characters and ``max_bytes`` UTF-8 bytes (never mid-character).
    """
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        # Only the part that can survive the cut is decoded (x4: escapes grow text).
        text = bytes(value[: max_bytes * 4]).decode("utf-8", errors="replace")
    else:
        text = value[: max_chars * 4]
        if not text.isascii():
            # The webhook client decodes headers with surrogateescape: no surrogate may stay.
            text = text.encode("utf-8", "surrogatepass").decode("utf-8", errors="replace")
    if _CONTROL.search(text):
        text = _CONTROL.sub(_escape, text)
    text = text[:max_chars]
    data = text.encode("utf-8")
    if len(data) > max_bytes:
        text = data[:max_bytes].decode("utf-8", errors="ignore")
    return text


# What ends a line for a log reader: \n and \r (``clean`` keeps \n: an excerpt's
# lines and a multi-line SMTP reply read better so in the database), and the
# Unicode line and paragraph separators, which ``clean`` does not escape; and what a
# terminal obeys instead of showing: every other C0 and C1 control (ESC starts the
# colour and cursor sequences that could rewrite a line already shown) and the
# bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069).
_LINE_BREAK = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def one_line(text: str) -> str:
    """``text`` with every line break and terminal control escaped (``\\n``,
    ``\\x1b``): for a line-based log or a terminal, where a receiver's text or a name
    with a newline could otherwise forge a line of its own (an SMTP server's
    multi-line reply is one: its lines are joined with \\n), or an escape sequence
    rewrite one."""
    return _LINE_BREAK.sub(_escape_break, text) if _LINE_BREAK.search(text) else text


def _escape_break(match: re.Match[str]) -> str:
    char = match.group()
    if char in "\n\r":
        return "\\n" if char == "\n" else "\\r"
    return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"


def failure(exc: BaseException) -> dict[str, Any]:
    """Log fields for an unexpected exception: its class and message cleaned, and
    where it was raised (frames only: our code, no receiver bytes)."""
    frames = "".join(traceback.format_tb(exc.__traceback__))
    return {"error": clean(f"{type(exc).__name__}: {exc}"), "where": frames[-2000:]}


MAX_NAME_CHARS = 200


def has_space_or_control(text: str) -> bool:
    """True when ``text`` holds whitespace or a character not shown as it is: what no
    URL, host name or address may hold (a CR LF in one was once stored and only
    failed at every send)."""
    return any(c.isspace() or not c.isprintable() for c in text)


def check_name(field: str, name: str, example: str) -> str:
    """A name a person gives (an endpoint's, a token's) that lists, logs and the audit
    trail show: at most 200 characters, every one printable. A name with a newline
    once printed a forged row in ``outbox tokens list``; one with ESC sequences
    recoloured or rewrote the operator's terminal; a bidirectional override showed it
    reversed."""
    from spark_outbox.core.errors import InvalidRequest

    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(
            field, f"is {len(name)} characters long", f"use at most {MAX_NAME_CHARS}"
        )
    for char in name:
        if not char.isprintable():  # controls, format characters, separators but space
            raise InvalidRequest(
                field,
                f"holds the character U+{ord(char):04X}, which is not shown as it is",
                f"use letters, digits, spaces and punctuation only, e.g. {example}",
            )
    return name
