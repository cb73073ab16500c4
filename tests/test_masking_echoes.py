"""A sensitive value echoed by a receiver is masked however it is grouped: with spaces,
dashes or dots between its characters (from 6 characters on), clipped at the end of an
excerpt, and a text that does not echo it is left as it was."""

from __future__ import annotations

import re
import string

from hypothesis import assume, given
from hypothesis import strategies as st

from spark_outbox.core import masking

PAN = "4111111111111111"
PATHS = ["card.pan"]
SEPARATORS = ["", " ", "-", ".", "  ", " - ", ". ", "\n", "\t"]
VALUES = st.text(alphabet=string.ascii_letters + string.digits, min_size=6, max_size=24)
# No "*" (the mask itself), no "{" or "[" (a JSON document is masked field by field
# first, and re-written); separators included.
TEXTS = st.text(
    alphabet=string.ascii_letters + string.digits + " -.\n\t,:;!?=()'\"@#/_", max_size=40
)


def _mask(text: str, value: str) -> str:
    payload = {"card": {"pan": value}}
    masked = masking.mask_text(text, PATHS, masking.masked_values(payload, PATHS))
    assert masked is not None
    return masked


def _folded(text: str) -> str:
    return re.sub(r"[\s.\-]", "", text).casefold()


def test_a_card_number_echoed_in_groups_of_four_is_masked() -> None:
    assert _mask("card 4111 1111 1111 1111 declined", PAN) == "card *** declined"
    assert _mask("pan=4111-1111-1111-1111.", PAN) == "pan=***."
    assert _mask("4111.1111.1111.1111", PAN) == "***"
    assert _mask("4111 - 1111 - 1111 - 1111 (visa)", PAN) == "*** (visa)"
    # A value grouped in the payload is found however the receiver writes it.
    assert _mask("card 4111111111111111 declined", "4111 1111 1111 1111") == "card *** declined"
    # Below six characters a value is matched only as written: "1-2-3-4-5" stays.
    assert _mask("steps 1-2-3-4-5 done, 12345 left", "12345") == "steps 1-2-3-4-5 done, *** left"


def test_an_excerpt_clipped_inside_a_grouped_card_number_ends_masked() -> None:
    assert _mask('HTTP 422\n\n{"card": {"pan": "4111 1111 11', PAN) == (
        'HTTP 422\n\n{"card": {"pan": "***'
    )


@st.composite
def _spaced_out(draw: st.DrawFn) -> tuple[str, str]:
    """(a value, the value as a receiver may write it: any case, any separators)."""
    value = draw(VALUES)
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(value), max_size=len(value)))
    upper = draw(st.lists(st.booleans(), min_size=len(value), max_size=len(value)))
    chars = [c.upper() if up else c.lower() for c, up in zip(value, upper, strict=True)]
    return value, "".join(c + s for c, s in zip(chars, [*seps[:-1], ""], strict=True))


@given(_spaced_out(), TEXTS, TEXTS)
def test_a_value_of_six_characters_never_survives_spaced_out_and_other_texts_are_unchanged(
    spaced: tuple[str, str], before: str, after: str
) -> None:
    value, written = spaced
    masked = _mask(before + written + after, value)
    assert _folded(value) not in _folded(masked), masked
    # Without the value (and not ending with its first 4 or more characters, which
    # a clipped excerpt would mask), a text comes back unchanged.
    text = before + after
    folded = _folded(text)
    assume(_folded(value) not in folded)
    assume(not any(folded.endswith(_folded(value)[:k]) for k in range(4, len(value))))
    assert _mask(text, value) == text
