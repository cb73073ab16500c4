"""Where outside text echoes sensitive values: the spans ``masking`` replaces with ``***``.

A value comes back in three shapes; each is found in time linear in the text's
length (plus the values' lengths), never by trying every value at every position:

1. Spaced out: a value with at least ``SPACED`` characters other than separators
   (whitespace, ``-``, ``.``) is found with any separators between its characters,
   as a receiver groups it (``4111 1111 1111 1111``, ``4111-1111-1111-1111``,
   ``4111.1111...``), case-insensitively. The text is folded once (separators
   dropped, case folded) with a map back to its positions, and each value is found
   there with ``str.find``. Six, because shorter values spaced out collide with
   ordinary text (times, versions, short dates) while a 4 or 5 character value is
   matched as written anyway; what receivers group (card numbers, IBANs, phone and
   national numbers, dates of birth) has six characters or more.
2. As written: a shorter value, case-insensitively; from 1 to ``SHORT`` - 1
   characters only as a whole word (a substring match would erase unrelated text
   while hiding little).
3. Clipped: a text cut in the middle of a value (excerpts are cut at 2 KiB) ends
   with the value's first characters; from ``SHORT`` on they are masked, as
   written or (rule 1's values) spaced out.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator, Sequence

SHORT = 4  # values shorter than this are masked as whole words only
SPACED = 6  # values with this many characters besides separators are found spaced out

# Whitespace (every character str.isspace() accepts: all below U+3001), dashes, dots.
_SEPARATORS = "".join(chr(c) for c in range(0x3001) if chr(c).isspace()) + "-."
_DROP_SEPARATORS = str.maketrans("", "", _SEPARATORS)  # translate: ~15x faster than re.sub
_KEPT = re.compile(f"[^{re.escape(_SEPARATORS)}]+")  # the runs between separators


def masked(text: str, values: Sequence[str], mask: str) -> str:
    """``text`` with every span that echoes one of ``values`` replaced by ``mask``."""
    spaced = [v for v in {_folded(v) for v in values} if len(v) >= SPACED]
    written = [v for v in values if len(_folded(v)) < SPACED]
    spans = list(_written(text, written))
    if spaced:
        spans.extend(_spaced(_Folded(text, spaced=True), spaced, len(text)))
    spans.extend(_clipped_as_written(text, values))
    return _replaced(text, spans, mask)


def _written(text: str, values: Sequence[str]) -> Iterable[tuple[int, int]]:
    if not values:
        return
    alternatives = [
        re.escape(v) if len(v) >= SHORT else rf"(?<!\w){re.escape(v)}(?!\w)"
        for v in sorted(values, key=len, reverse=True)
    ]
    for match in re.finditer("|".join(alternatives), text, flags=re.IGNORECASE):
        yield match.span()


def _spaced(text: _Folded, values: Sequence[str], end: int) -> Iterable[tuple[int, int]]:
    folded = text.text
    for value in values:
        at = folded.find(value)
        while at >= 0:  # leftmost, not overlapping: what overlaps is masked with it
            yield text.origin[at], text.origin[at + len(value) - 1] + 1
            at = folded.find(value, at + len(value))
        start = _longest_start_at_end(folded[-(len(value) - 1) :], value)
        if start >= SHORT:
            yield text.origin[len(folded) - start], end


def _clipped_as_written(text: str, values: Sequence[str]) -> Iterable[tuple[int, int]]:
    for value in values:
        if len(value) <= SHORT:
            continue
        raw = text[-(len(value) - 1) :]
        tail = _Folded(raw, spaced=False)
        start = _longest_start_at_end(tail.text, value.casefold())
        if start >= SHORT:
            yield len(text) - len(raw) + tail.origin[len(tail.text) - start], len(text)


class _Folded:
    """A text case-folded (separators dropped if ``spaced``), and for each of its
    characters the position in the text it came from (``origin``: built only when
    something is found, as most texts echo nothing)."""

    def __init__(self, text: str, *, spaced: bool) -> None:
        self._text, self._spaced = text, spaced
        whole = text.casefold()
        self._aligned = len(whole) == len(text)  # casefold never shortens: one for one
        if self._aligned:
            self.text = whole.translate(_DROP_SEPARATORS) if spaced else whole
        else:  # some character folds to several ("ß" -> "ss")
            self.text = "".join(one for one, _ in self._each())

    @functools.cached_property
    def origin(self) -> list[int]:
        if not self._aligned:
            return [i for _, i in self._each()]
        if not self._spaced:
            return list(range(len(self._text)))
        origin: list[int] = []
        for run in _KEPT.finditer(self._text):
            origin.extend(range(*run.span()))
        return origin

    def _each(self) -> Iterator[tuple[str, int]]:
        text = self._text
        runs = [m.span() for m in _KEPT.finditer(text)] if self._spaced else [(0, len(text))]
        for start, stop in runs:
            for i in range(start, stop):
                for one in text[i].casefold():
                    yield one, i


def _folded(value: str) -> str:
    return _Folded(value, spaced=True).text


def _longest_start_at_end(text: str, value: str) -> int:
    """How many first characters of ``value`` ``text`` ends with (Knuth-Morris-Pratt:
    linear, where trying every suffix is quadratic in the value's length)."""
    if not value:
        return 0
    border = [0] * len(value)
    k = 0
    for i in range(1, len(value)):
        while k and value[i] != value[k]:
            k = border[k - 1]
        if value[i] == value[k]:
            k += 1
        border[i] = k
    k = 0
    for ch in text:
        if k == len(value):
            k = border[k - 1]
        while k and ch != value[k]:
            k = border[k - 1]
        if ch == value[k]:
            k += 1
    return k


def _replaced(text: str, spans: Iterable[tuple[int, int]], mask: str) -> str:
    """``text`` with the union of ``spans`` replaced, one ``mask`` per joined span."""
    out: list[str] = []
    done = 0
    for start, stop in sorted(spans):
        if stop <= done:
            continue
        if start > done or not out:
            out.append(text[done:start])
            out.append(mask)
        done = max(done, stop)
    out.append(text[done:])
    return "".join(out)
