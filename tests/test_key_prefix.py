"""The law behind finding a key by its printed start: under any collation, the range
``prefix <= key < prefix || 'g'`` holds exactly the hex keys that start with the
prefix (filters.EffectFilter.params), so the unique key index serves the search in
a database whose collation is not C, where ``LIKE 'prefix%'`` could not use it.
Checked by PostgreSQL itself, under C and under ICU's collations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy.engine import Connection, Engine

from spark_outbox.console.filters import MIN_KEY_PREFIX, InvalidFilter, build_filter

HEX = "0123456789abcdef"
keys = st.text(HEX, min_size=64, max_size=64)


@pytest.fixture(scope="module")
def conn(server_url: str) -> Iterator[Connection]:
    from spark_outbox.core import db

    engine: Engine = db.create_engine(server_url, pool_size=1)
    try:
        with engine.connect() as connection:
            yield connection
    finally:
        engine.dispose()


def _collations(conn: Connection) -> list[str]:
    wanted = ("C", "default", "en-x-icu", "de-x-icu", "sv-x-icu", "und-x-icu")
    found = conn.execute(
        sa.text("SELECT collname FROM pg_collation WHERE collname = ANY(:names)"),
        {"names": list(wanted)},
    )
    return sorted({r[0] for r in found})


@settings(max_examples=60, deadline=None)
@given(
    stored=st.lists(keys, min_size=1, max_size=30),
    pick=st.integers(min_value=0),
    length=st.integers(min_value=MIN_KEY_PREFIX, max_value=64),
    near=keys,
)
def test_the_prefix_range_selects_exactly_the_keys_with_the_prefix_under_every_collation(
    conn: Connection, stored: list[str], pick: int, length: int, near: str
) -> None:
    # Keys that share the prefix, and keys beside it (the next hex digit, one more char).
    prefix = stored[pick % len(stored)][:length]
    stored = [*stored, near, prefix + near[length:], prefix[:-1] + "f" + near[length:]]
    flt = build_filter(since=None, until=None, key_prefix=prefix.upper() + "…")
    params = flt.params()
    expected = sorted(k for k in stored if k.startswith(prefix))
    for collation in _collations(conn):
        found = conn.execute(
            sa.text(
                f"SELECT k FROM unnest(CAST(:keys AS text[])) AS k "
                f'WHERE k COLLATE "{collation}" >= :lo AND k COLLATE "{collation}" < :hi '
                'ORDER BY k COLLATE "C"'
            ),
            {"keys": stored, "lo": params["key_prefix"], "hi": params["key_prefix_end"]},
        )
        assert [r[0] for r in found] == expected, collation


def test_a_prefix_is_refused_unless_it_is_eight_to_sixty_four_hex_characters() -> None:
    for bad in ("abc", "1234567", "xyz12345678", "a" * 65, "12345678 9"):
        with pytest.raises(InvalidFilter) as refused:
            build_filter(since=None, until=None, key_prefix=bad)
        assert refused.value.field == "key_prefix" and "at least 8" in refused.value.fix
    for printed, kept in (("13DD1F9D44FA…", "13dd1f9d44fa"), (" abcdef01... ", "abcdef01")):
        assert build_filter(since=None, until=None, key_prefix=printed).key_prefix == kept
