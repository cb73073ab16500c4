"""``outbox verify``: a real drain checks clean; each invariant, broken by hand in the
real database, is found and named; the range checks read the history once, in
chunks; the continuous mode exports the counts as metrics."""

from __future__ import annotations

import datetime as dt
import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from spark_outbox.cli.main import main
from spark_outbox.console import verify
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.enqueue import enqueue
from spark_outbox.core.keys import effect_key
from spark_outbox.core.settings import Settings
from tests.api.builders import add_batch
from tests.dispatcher.conftest import Receiver, Reply, run_worker


def _cli(db_url: str, *argv: str) -> int:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DATABASE_URL", db_url)
        return main(["--log-format", "text", *argv])


def _drained(engine: Engine, fast: Settings, receiver: Receiver, n: int = 20) -> list[str]:
    """n effects through the real dispatcher: most delivered, some dead after a 400."""
    receiver.script("/dead", Reply(400))
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url=receiver.url())
        add_webhook(conn, name="gone", url=receiver.url("/dead"))
        keys = [effect_key("verify", i) for i in range(n)]
        for i, key in enumerate(keys):
            enqueue(
                conn,
                idempotency_key=key,
                endpoint="gone" if i % 5 == 0 else "hook",
                payload={"n": i},
            )
    assert run_worker(fast, engine) == 0
    return keys


def _once(engine: Engine, **kw: float) -> verify.PassReport:
    with engine.connect() as conn:
        return verify.Checker(settle_s=0, **kw).run_until_current(conn)  # type: ignore[arg-type]


def test_a_real_drain_breaks_no_invariant(
    db_url: str,
    engine: Engine,
    fast: Settings,
    receiver: Receiver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _drained(engine, fast, receiver)
    with engine.begin() as conn:
        add_batch(conn, "job", "b1", [{"name": "x"}, {"name": "y"}])
    assert _cli(db_url, "verify", "--once") == 0
    out = capsys.readouterr().out
    assert out.startswith("verify: no violation (effects 22, finished 20, markers 1 row(s) read)")


def _violations(engine: Engine) -> dict[str, list[verify.Violation]]:
    found: dict[str, list[verify.Violation]] = {}
    for v in _once(engine).violations:
        found.setdefault(v.check, []).append(v)
    return found


def test_each_broken_invariant_is_found_and_named(
    db_url: str,
    engine: Engine,
    fast: Settings,
    receiver: Receiver,
    capsys: pytest.CaptureFixture[str],
) -> None:
    keys = _drained(engine, fast, receiver)
    with engine.begin() as conn:
        held = add_batch(conn, "job", "held", [{"name": "h1"}, {"name": "h2"}])
        counted = add_batch(conn, "job", "miscounted", [{"name": "m1"}], effects_new=2)
        run = uuid.uuid4()
        conn.execute(
            sa.text("INSERT INTO batch_runs (run_id, job, batch_id) VALUES (:r, 'job', 'flying')"),
            {"r": run},
        )
        enqueue(conn, idempotency_key=effect_key("verify", "leased"), endpoint="hook", payload={})
        enqueue(
            conn,
            idempotency_key=effect_key("verify", "overdue"),
            endpoint="hook",
            payload={},
            expires_at=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1),
        )
        sql = [
            # A delivered effect whose send started after its send-by time.
            (
                "UPDATE effects SET expires_at = (SELECT min(started_at) FROM delivery_attempts"
                " WHERE effect_id = effects.id) - interval '1 second' WHERE idempotency_key = :k6"
            ),
            # A delivered effect that lost its delivered attempt.
            (
                "DELETE FROM delivery_attempts WHERE effect_id = "
                "(SELECT id FROM effects WHERE idempotency_key = :k1)"
            ),
            # The trigger that keeps a deleted finished effect's key, switched off.
            "ALTER TABLE effects DISABLE TRIGGER effects_keys_kept_on_delete",
            # A delivered effect sent and delivered again with no operator's resend.
            (
                "INSERT INTO delivery_attempts (effect_id, attempt, worker_id, started_at,"
                " duration_ms, outcome) SELECT id, attempt_count + 1, 'w', now(), 1, 'delivered'"
                " FROM effects WHERE idempotency_key = :k6"
            ),
            "UPDATE effects SET attempt_count = attempt_count + 1 WHERE idempotency_key = :k6",
            # A held batch with one of its effects leased.
            "UPDATE batches SET hold_state = 'held', hold_reason = 'r' WHERE batch_id = 'held'",
            f"UPDATE effects SET state = 'leased', lease_expires_at = now()"
            f" WHERE id = {held[0].id}",
            # A lease that expired an hour ago and stayed.
            (
                "UPDATE effects SET state = 'leased', lease_owner = 'gone-worker', "
                "lease_expires_at = now() - interval '1 hour' WHERE idempotency_key = :k3"
            ),
            # An effect of a run in flight (no marker yet) that was attempted.
            (
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload, "
                "payload_sha256, state, attempt_count, lease_expires_at) VALUES (:k4, 'job', "
                "'flying', :run, 'hook', '{}', 'x', 'leased', 1, now() + interval '1 hour')"
            ),
            # A Spark effect row whose run neither committed nor is in flight.
            (
                "INSERT INTO effects (idempotency_key, job, batch_id, run_id, endpoint, payload, "
                "payload_sha256) VALUES (:k5, 'job', 'orphan', :orphan, 'hook', '{}', 'x')"
            ),
        ]
        params = {
            "k1": keys[1],
            "k3": effect_key("verify", "leased"),
            "k4": effect_key("verify", "flying"),
            "k5": effect_key("verify", "orphan"),
            "k6": keys[3],
            "run": run,
            "orphan": uuid.uuid4(),
        }
        for statement in sql:
            conn.execute(sa.text(statement), params)
    found = _violations(engine)
    assert sorted(found) == sorted(verify.CHECKS)
    assert [v.key for v in found["finished_without_attempts"]] == [keys[1]]
    assert "no delivered attempt" in found["finished_without_attempts"][0].detail
    (guard,) = found["ledger_guard_off"]
    assert "effects_keys_kept_on_delete is disabled" in guard.detail and guard.key is None
    assert [v.key for v in found["delivered_again_unasked"]] == [keys[3]]
    assert "without an operator's resend" in found["delivered_again_unasked"][0].detail
    assert [v.row_id for v in found["held_batch_leased"]] == [held[0].id]
    assert "gone-worker" in found["lease_overdue"][0].detail
    assert [v.key for v in found["sent_before_commit"]] == [effect_key("verify", "flying")]
    assert [v.key for v in found["effect_without_marker"]] == [effect_key("verify", "orphan")]
    assert [v.key for v in found["sent_after_expiry"]] == [keys[3]]
    assert "attempt 1 (delivered) started" in found["sent_after_expiry"][0].detail
    assert [v.key for v in found["expiry_overdue"]] == [effect_key("verify", "overdue")]
    (miscount,) = found["marker_counts"]
    assert "miscounted" in miscount.detail and "1 new effect" not in miscount.detail
    assert counted and "2 new effect(s)" in miscount.detail
    # The command says so and fails: CI and the drills use its exit status.
    assert _cli(db_url, "verify", "--once", "--json") == 1
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[-1]
        == f"verify: {len(lines) - 1} violation(s) (effects 27, finished 20, markers 2 row(s) read)"
    )
    assert {json.loads(line)["check"] for line in lines[:-1]} == set(verify.CHECKS)


def test_the_grace_keeps_a_lease_that_just_expired_out(engine: Engine) -> None:
    with engine.begin() as conn:
        add_webhook(conn, name="hook", url="https://example.com/h")
        enqueue(conn, idempotency_key=effect_key("v", 1), endpoint="hook", payload={})
        conn.execute(
            sa.text(
                "UPDATE effects SET state = 'leased', lease_expires_at = now() - interval '10 s'"
            )
        )
    assert _once(engine, grace_s=60).ok
    assert [v.check for v in _once(engine, grace_s=5).violations] == ["lease_overdue"]


def test_the_range_checks_read_the_history_once_in_chunks(
    engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _drained(engine, fast, receiver, n=25)
    checker = verify.Checker(settle_s=0, chunk=10)
    reads = []
    with engine.connect() as conn:
        for _ in range(4):
            report = checker.run_pass(conn)
            reads.append((report.checked["effects"], report.checked["finished"], report.caught_up))
    # 25 effects, 25 finished: three passes of at most 10 each, then nothing new to read.
    assert reads == [(10, 10, False), (10, 10, False), (5, 5, True), (0, 0, True)]
    with engine.begin() as conn:
        enqueue(conn, idempotency_key=effect_key("v", "new"), endpoint="hook", payload={})
    with engine.connect() as conn:
        assert checker.run_pass(conn).checked["effects"] == 1


def test_bad_settings_are_one_line_errors(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(db_url, "verify", "--once", "--chunk", "0") == 2
    assert "--chunk must be a finite number >= 1" in capsys.readouterr().err
    assert _cli(db_url, "verify", "--interval", "0") == 2
    assert "--interval must be > 0" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_continuous_checker_exports_its_counts_as_metrics(
    db_url: str, engine: Engine, fast: Settings, receiver: Receiver
) -> None:
    _drained(engine, fast, receiver, n=5)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TRIGGER effects_keys_kept_on_delete ON effects"))
    port = _free_port()
    env = {"DATABASE_URL": db_url, "PATH": "/usr/bin:/bin"}
    cmd = [
        sys.executable,
        "-m",
        "spark_outbox",
        "verify",
        "--interval",
        "0.2",
        "--settle-s",
        "0",
        "--metrics-port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        text = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
            except OSError:
                text = ""
            if "outbox_verify_caught_up 1.0" in text:
                break
            time.sleep(0.2)
        assert 'outbox_verify_violations{check="ledger_guard_off"} 1.0' in text
        assert 'outbox_verify_violations{check="lease_overdue"} 0.0' in text
        assert "outbox_verify_last_run_timestamp_seconds" in text
    finally:
        proc.terminate()
        try:
            _, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
    assert b"ledger_guard_off" in err and b"is missing" in err
