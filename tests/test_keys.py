from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_outbox.core.keys import effect_key, encode_part, encode_parts, is_valid_key

SCALARS = st.one_of(
    st.none(),
    st.text(),
    st.text(alphabet="|\\:,;\x00\u2028 sSnN0"),  # separators and tag letters inside values
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.floats(allow_nan=False),
    st.decimals(allow_nan=False, allow_infinity=False),
    st.binary(),
    st.dates(),
    st.datetimes(timezones=st.timezones()),
)


def test_key_is_64_lowercase_hex() -> None:
    key = effect_key("invoice.created", "cust-1", dt.date(2026, 1, 2))
    assert is_valid_key(key)
    assert len(key) == 64


@given(st.text(min_size=1), st.lists(SCALARS, max_size=5))
def test_key_is_deterministic(namespace: str, parts: list[object]) -> None:
    assert effect_key(namespace, *parts) == effect_key(namespace, *parts)  # type: ignore[arg-type]


@given(st.lists(SCALARS, max_size=4), st.lists(SCALARS, max_size=4))
def test_different_encodings_never_collide(a: list[object], b: list[object]) -> None:
    # The encoding is injective on canonical values, so equal keys imply equal encodings.
    enc_a, enc_b = encode_parts("ns", *a), encode_parts("ns", *b)  # type: ignore[arg-type]
    if enc_a != enc_b:
        assert effect_key("ns", *a) != effect_key("ns", *b)  # type: ignore[arg-type]


@given(st.text(), st.text())
def test_separator_inside_a_value_cannot_forge_a_boundary(a: str, b: str) -> None:
    joined = a + "|" + b
    assert effect_key("ns", a, b) != effect_key("ns", joined)
    assert effect_key("ns", a, b) != effect_key("ns", joined, "")


@pytest.mark.parametrize(
    ("left", "right"),
    [
        ((None,), ("",)),
        ((None,), ("None",)),
        (("",), ()),
        ((None, None), (None,)),
        ((1,), ("1",)),
        ((1,), (1.0,)),
        ((1,), (True,)),
        ((0,), (False,)),
        ((1,), (Decimal("1"),)),
        ((1.0,), (Decimal("1.0"),)),
        ((0.0,), (-0.0,)),
        (("a", "b"), ("a|b",)),
        (("a|", "b"), ("a", "|b")),
        (("ab", "c"), ("a", "bc")),
        ((b"a",), ("a",)),
        ((dt.date(2026, 1, 1),), ("2026-01-01",)),
        ((dt.date(1970, 1, 2),), (1,)),
        (("é",), ("e\u0301",)),  # NFC vs NFD: different bytes, different keys
    ],
)
def test_near_miss_inputs_get_different_keys(
    left: tuple[object, ...], right: tuple[object, ...]
) -> None:
    assert effect_key("ns", *left) != effect_key("ns", *right)  # type: ignore[arg-type]


def test_namespace_separates_effect_kinds() -> None:
    assert effect_key("invoice.created", "c1") != effect_key("invoice.email", "c1")


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (Decimal("1.10"), Decimal("1.1")),
        (Decimal("100"), Decimal("1E+2")),
        (Decimal("-0"), Decimal("0.000")),
        (
            dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC),
            dt.datetime(2026, 1, 1, 13, 0, tzinfo=dt.timezone(dt.timedelta(hours=1))),
        ),
    ],
)
def test_equal_values_in_different_notation_share_a_key(a: object, b: object) -> None:
    assert effect_key("ns", a) == effect_key("ns", b)  # type: ignore[arg-type]


def test_encoding_is_stable_across_releases() -> None:
    # Changing this string changes every key ever issued: never do it in place.
    assert encode_parts("ns", None, "a|", 7, Decimal("1.50"), dt.date(1970, 1, 3), True) == (
        "v1|s6E73|N|s617C|i7|n1.5|d2|b1"
    )
    assert effect_key("invoice.created", "cust-1") == (
        "0bcd9c5764d635d310edcb30dd4feca0aa3beeec41e61064ab0abe0d45c518fc"
    )


def test_naive_timestamps_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="no time zone"):
        effect_key("ns", dt.datetime(2026, 1, 1))


def test_unsupported_types_name_the_conversion() -> None:
    with pytest.raises(TypeError, match="convert it to"):
        encode_part([1, 2])  # type: ignore[arg-type]


def test_non_finite_decimals_are_refused() -> None:
    with pytest.raises(ValueError, match="not finite"):
        effect_key("ns", Decimal("NaN"))


def test_empty_namespace_is_refused() -> None:
    with pytest.raises(ValueError, match="namespace"):
        effect_key("")


def test_a_revision_is_a_new_key_and_names_the_one_it_supersedes() -> None:
    from spark_outbox.core.keys import encode_parts, superseded_key

    original = effect_key("invoice.issued", "B")
    assert effect_key("invoice.issued", "B", revision=1) == original
    second = effect_key("invoice.issued", "B", revision=2)
    assert second != original and encode_parts("invoice.issued", "B", revision=2).endswith("|r2")
    assert superseded_key("invoice.issued", "B", revision=2) == original
    assert superseded_key("invoice.issued", "B", revision=3) == second
    assert superseded_key("invoice.issued", "B", revision=1) is None
    # "r2" is no part's tag: no part list can forge a revision's encoding.
    assert second not in {
        effect_key("invoice.issued", "B", "r2"),
        effect_key("invoice.issued", "B", 2),
    }
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="revision"):
            effect_key("invoice.issued", "B", revision=bad)  # type: ignore[arg-type]
