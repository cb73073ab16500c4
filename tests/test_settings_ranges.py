"""Every number a dispatcher or the API runs on is refused at start outside a range
that works, naming the variable and a value to use: found by probing the CLI as an
operator might, each value below once started a dispatcher that never claimed,
failed every claim, crashed a side task at its first pass, or served on another port."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings

ONCE_BROKEN = [
    ("OUTBOX_CONCURRENCY", "0"),
    ("OUTBOX_CONCURRENCY", "-5"),
    ("OUTBOX_CLAIM_BATCH_SIZE", "0"),
    ("OUTBOX_LEASE_S", "nan"),
    ("OUTBOX_LEASE_S", "1e308"),
    ("OUTBOX_LEASE_S", "0.001"),
    ("OUTBOX_POLL_INTERVAL_S", "nan"),
    ("OUTBOX_POLL_INTERVAL_S", "1e308"),
    ("OUTBOX_HEARTBEAT_INTERVAL_S", "nan"),
    ("OUTBOX_AUTO_DISABLE_AFTER_S", "1e308"),
    ("OUTBOX_RETENTION_OLDER_THAN", "99999999999d"),
    ("OUTBOX_API_PORT", "70000"),
    ("OUTBOX_LOG_LEVEL", "FOO"),
    ("OUTBOX_LOG_FORMAT", "xml"),
]


@pytest.mark.parametrize(("name", "value"), ONCE_BROKEN)
def test_a_value_that_once_broke_a_dispatcher_is_refused_naming_it(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as refused:
        Settings.from_env({name: value, "HOME": "/nonexistent"})
    assert str(refused.value).startswith(f"{name}=")


def test_the_dispatcher_command_refuses_it_in_one_line_before_any_connection() -> None:
    env = os.environ | {"OUTBOX_CONCURRENCY": "0", "DATABASE_URL": "postgresql://u@127.0.0.1:1/x"}
    done = subprocess.run(
        [sys.executable, "-m", "spark_outbox", "dispatcher", "run", "--until-idle"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "outbox: error: OUTBOX_CONCURRENCY=0 is out of range; use 1 to 10000, e.g. 128"
    ]


NUMERIC = [
    "OUTBOX_CONCURRENCY",
    "OUTBOX_CLAIM_BATCH_SIZE",
    "OUTBOX_LEASE_S",
    "OUTBOX_POLL_INTERVAL_S",
    "OUTBOX_SHUTDOWN_TIMEOUT_S",
    "OUTBOX_HEARTBEAT_INTERVAL_S",
    "OUTBOX_PROGRESS_INTERVAL_S",
    "OUTBOX_RETRY_AFTER_CAP_S",
    "OUTBOX_AUTO_DISABLE_AFTER_S",
    "OUTBOX_RETENTION_INTERVAL_S",
    "OUTBOX_API_PORT",
]


@given(
    name=st.sampled_from(NUMERIC),
    value=st.one_of(
        st.floats(allow_nan=True, allow_infinity=True).map(repr),
        st.integers(-(10**30), 10**30).map(str),
    ),
)
def test_any_number_is_taken_finite_or_refused_naming_its_variable(name: str, value: str) -> None:
    try:
        settings = Settings.from_env({name: value, "HOME": "/nonexistent"})
    except ConfigurationError as refused:
        assert str(refused).startswith(f"{name}="), refused
        return
    field = name.removeprefix("OUTBOX_").lower()
    taken = getattr(settings, field)
    assert math.isfinite(taken) and taken >= 0, (name, value)


@given(st.text(max_size=80))
def test_any_database_url_is_taken_usable_or_refused_naming_it(rest: str) -> None:
    """Whatever follows the scheme: refused in one line naming DATABASE_URL, without
    the password, or an engine can be built from it (no connection is made)."""
    from spark_outbox.core import db

    url = f"postgresql://u:s3cret@{rest}"
    try:
        Settings.from_env({"DATABASE_URL": url, "HOME": "/nonexistent"})
    except ConfigurationError as refused:
        assert str(refused).startswith("DATABASE_URL "), refused
        assert "s3cret" not in str(refused)
        return
    db.create_engine(url).dispose()
