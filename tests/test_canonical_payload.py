"""The canonical payload bytes have one definition, and the fast path keeps it.

``payload_bytes`` (what ``enqueue`` stores and hashes, and what the Spark sink's
executors compute for every row) parses JSON text with orjson and sorts the keys
with it; the definition is Python's ``json`` round trip (sorted keys, ``(",", ":")``,
UTF-8, no NaN). These property tests say the fast path gives exactly the
definition's bytes, or the definition's own error, for arbitrary JSON and for
text that is nearly JSON; the examples pin the cases where orjson on its own
would print something else (exponents, tiny floats, integers past 64 bits), and
a pinned hash says stored rows keep theirs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_outbox.core.errors import InvalidEffect
from spark_outbox.core.validation import _exact_canonical, payload_bytes, payload_sha256


def definition(text: str) -> bytes:
    """The canonical bytes as defined, written out independently of the code."""
    return json.dumps(
        json.loads(text), sort_keys=True, separators=(",", ":"), ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")  # fmt: skip


def outcome(text: str) -> bytes | str:
    """payload_bytes' bytes, or its error message."""
    try:
        return payload_bytes(text)
    except InvalidEffect as exc:
        return f"refused: {exc}"


def exact_outcome(text: str) -> bytes | str:
    try:
        return _exact_canonical(text)
    except InvalidEffect as exc:
        return f"refused: {exc}"


texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=10)
numbers = st.one_of(
    st.integers(),  # unbounded: hypothesis draws far past 64 bits
    st.floats(allow_nan=False, allow_infinity=False),
    st.floats(min_value=-1e-3, max_value=1e-3, allow_nan=False),
    st.floats(min_value=1e14, max_value=1e20),
)
json_values = st.recursive(
    st.none() | st.booleans() | numbers | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
objects = st.dictionaries(texts, json_values, max_size=5)
renderings = st.sampled_from(
    [
        lambda v: json.dumps(v),
        lambda v: json.dumps(v, ensure_ascii=False),
        lambda v: json.dumps(v, indent=2, sort_keys=True),
        lambda v: json.dumps(v, separators=(",", ":"), ensure_ascii=False),
    ]
)
# Numbers as a producer may write them (JVM doubles, decimals, exponents of any case).
number_texts = st.from_regex(
    r"\A-?(0|[1-9][0-9]{0,25})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?\Z", fullmatch=True
)


@settings(max_examples=1500, deadline=None)
@given(objects, renderings)
def test_fast_canonical_bytes_are_the_definition_for_any_json_object(
    value: dict[str, object], render: Callable[[object], str]
) -> None:
    text = render(value)
    got = outcome(text)
    assert got == exact_outcome(text)  # the same bytes, or the same refusal
    if isinstance(got, bytes):
        assert got == definition(text)
        assert payload_sha256(got) == hashlib.sha256(definition(text)).hexdigest()


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(texts, number_texts), min_size=1, max_size=4))
def test_numbers_written_any_way_canonicalise_as_the_definition_says(
    members: list[tuple[str, str]],
) -> None:
    text = "{" + ",".join(f"{json.dumps(k)}: {n}" for k, n in members) + "}"
    assert outcome(text) == exact_outcome(text)
    if not isinstance(outcome(text), str):
        assert outcome(text) == definition(text)


near_json = st.one_of(
    st.text(alphabet='{}[]":,.-+eE0123456789 \t\n\\u"abNIfinityal', max_size=30),
    st.text(max_size=20),
    objects.map(json.dumps).map(lambda t: t[: len(t) // 2]),
    objects.map(json.dumps).map(lambda t: t + ","),
    st.builds(
        lambda a, b: a + b,
        st.sampled_from(["\ufeff", " ", "\x00", "NaN", ""]),
        objects.map(json.dumps),
    ),
)


@settings(max_examples=1500, deadline=None)
@given(near_json)
def test_any_text_gets_the_definitions_bytes_or_its_exact_refusal(text: str) -> None:
    assert outcome(text) == exact_outcome(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1e-5}',  # orjson alone: 0.00001; Python: 1e-05
        '{"a": 1.5e-7}',  # orjson alone: 1.5e-7; Python: 1.5e-07
        '{"a": 0.00005}',
        '{"a": 1e16}',
        '{"a": 1E22, "b": 123456789012345680.0}',
        '{"a": 123456789012345678901234567890}',  # orjson alone: a float
        '{"a": -9223372036854775809, "b": 18446744073709551616}',
        '{"a": 18446744073709551615, "b": -9223372036854775808}',
        '{"a": -0, "b": -0.0, "c": 0.0001, "d": 100.0}',
        '{"k": 1, "k": 2}',
        '{"\\u00e9": 1, "z": 2, "\\ud83d\\ude00": 3, "\\uffff": 4}',
        '{"s": "\\b\\f\\n\\r\\t\\u001f\\u007f\\u2028 \\"/\\\\"}',
        '{"text": "one-e-two 3e-4 0.00001"}',  # suspicious text only: exact path, same bytes
    ],
)
def test_numbers_orjson_would_print_differently_keep_the_definitions_bytes(text: str) -> None:
    assert payload_bytes(text) == definition(text)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"a": NaN}', "cannot be encoded as JSON"),
        ('{"a": 1e400}', "cannot be encoded as JSON"),
        ('{"a": "\\ud800"}', "cannot be encoded as JSON"),
        ('{"a": "\\u0000"}', "NUL character"),
        ("\ufeff{}", "is not valid JSON"),
        ("[1, 2]", "not an object"),
        ('{"big": "' + "x" * 300_000 + '"}', "byte limit"),
        ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ],
)
def test_refused_payloads_get_the_exact_reason(text: str, reason: str) -> None:
    with pytest.raises(InvalidEffect, match=reason) as caught:
        payload_bytes(text)
    assert str(caught.value).startswith("payload")


def test_a_deeply_nested_dict_is_refused_not_a_crash() -> None:
    value: dict[str, object] = {}
    for _ in range(100_000):
        value = {"a": value}
    with pytest.raises(InvalidEffect, match="nested too deeply"):
        payload_bytes(value)


def test_stored_hashes_do_not_change() -> None:
    """A payload's hash as the json-only code computed it before the fast path."""
    text = '{"currency": "EUR", "amount": 12.5, "tiny": 1e-05, "name": "Zoë", "n": [1, 2]}'
    data = b'{"amount":12.5,"currency":"EUR","n":[1,2],"name":"Zo\xc3\xab","tiny":1e-05}'
    assert payload_bytes(text) == data
    assert payload_sha256(payload_bytes(text)) == (
        "5f1f155de818bd3a595173d2ebd9a692c3d53112adebfb40087edac7d099bd40"
    )
