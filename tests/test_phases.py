"""The test hook of a batch write's phases (spark_outbox.spark.phases): one variable, read
once per process; nothing runs at a phase unless a test asked for it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import psycopg2
import pyarrow as pa
import pytest

from spark_outbox.core import db
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.keys import effect_key
from spark_outbox.spark import phases
from spark_outbox.spark.chunks import write_effects
from spark_outbox.spark.protocol import RunTag
from tests.spark.helpers import EFFECT_ARROW_SCHEMA

RUN = "00000000-0000-0000-0000-0000000000bb"


@pytest.fixture(autouse=True)
def fresh_hooks() -> Iterator[None]:
    phases._hooks.cache_clear()
    yield
    phases._hooks.cache_clear()  # the next test's process state comes from its own env


def test_without_the_variable_a_phase_prints_nothing_and_runs_nothing(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(phases.ENV, raising=False)
    for name in phases.NAMES:
        phases.reached(name)
    assert capsys.readouterr().err == ""
    assert phases._hooks() == {}


def test_a_pause_prints_every_phase_and_pauses_only_at_its_own(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(phases.ENV, "written:0.3")
    started = time.monotonic()
    phases.reached("writing")
    quick = time.monotonic() - started
    phases.reached("written")
    paused = time.monotonic() - started - quick
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ")[1] for line in lines] == ["writing", "written"]
    assert all(line.startswith("outbox-phase: ") for line in lines)
    assert quick < 0.2 <= paused


def test_the_variable_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(phases.ENV, raising=False)
    phases.reached("writing")
    monkeypatch.setenv(phases.ENV, "writing:30")
    started = time.monotonic()
    phases.reached("writing")
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("setting", ["before_comit:5", "1", "written:soon"])
def test_a_wrong_setting_is_refused_naming_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv(phases.ENV, setting)
    with pytest.raises(ConfigurationError, match=phases.ENV) as refused:
        phases.reached("writing")
    assert "before_commit" in str(refused.value)


def test_a_registered_callback_runs_at_its_phase_until_removed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(phases.ENV, raising=False)
    calls: list[str] = []
    remove = phases.on("before_commit", lambda: calls.append("before_commit"))
    phases.reached("after_commit")
    phases.reached("before_commit")
    remove()
    phases.reached("before_commit")
    assert calls == ["before_commit"]
    with pytest.raises(ConfigurationError, match="no phase named 'commit'"):
        phases.on("commit", lambda: None)


def test_an_executor_task_announces_and_pauses_once_after_its_first_chunk(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], db_url: str
) -> None:
    """The kill tests' "mid-write" point: the first chunk is committed (invisible),
    the task pauses there once, the later chunks follow."""
    monkeypatch.setenv(phases.ENV, "effects_written:0.5")
    rows = [
        {
            "idempotency_key": effect_key("phase", i),
            "endpoint": "hook",
            "payload": json.dumps({"i": i}),
        }
        for i in range(3)
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=EFFECT_ARROW_SCHEMA)
    run = RunTag(db.libpq_url(db_url), "t", "b1", RUN, {"hook": "webhook"})
    conn = psycopg2.connect(run.dsn)
    started = time.monotonic()
    try:
        report = write_effects(conn, run, 1, [batch.slice(i, 1) for i in range(3)], 1)
    finally:
        conn.close()
    lines = capsys.readouterr().err.splitlines()
    assert report.rows == 3
    assert [line.split(" ")[1] for line in lines] == ["effects_written"]
    assert time.monotonic() - started >= 0.5
