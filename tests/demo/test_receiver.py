"""The reference webhook receiver, run as `outbox receiver serve`, over real HTTP."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook

from spark_outbox.cli.tools.receipts import fails
from spark_outbox.core.endpoints import generate_signing_secret
from tests.demo.procs import outbox_process

SECRET = generate_signing_secret()


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    jsonl = tmp_path_factory.mktemp("receiver") / "receipts.jsonl"
    with outbox_process(
        "receiver", "serve", "--port", "0", "--jsonl", str(jsonl),
        env={"OUTBOX_RECEIVER_SECRET": SECRET},
    ) as (_, info):  # fmt: skip
        yield info | {"jsonl": jsonl}


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    resp = httpx.post(url, content=body, headers=headers, timeout=5)
    return resp.status_code, resp.json()


def signed(payload: dict[str, Any], msg_id: str, secret: str = SECRET) -> tuple[bytes, dict]:
    body = json.dumps(payload)
    now = dt.datetime.now(dt.UTC)
    headers = {
        "content-type": "application/json",
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, now, body),
    }
    return body.encode(), headers


def stats(receiver: dict[str, Any]) -> dict[str, int]:
    return httpx.get(receiver["url"] + "/stats", timeout=5).json()  # type: ignore[no-any-return]


def test_a_signed_delivery_is_accepted_and_counted_once(receiver: dict[str, Any]) -> None:
    before = stats(receiver)
    key = uuid.uuid4().hex
    status, answer = post(receiver["url"] + "/hooks/billing", *signed({"n": 1}, key))
    assert (status, answer) == (200, {"received": True, "duplicate": False})
    after = stats(receiver)
    assert after["raw"] - before["raw"] == 1
    assert after["unique"] - before["unique"] == 1
    lines = [json.loads(x) for x in Path(receiver["jsonl"]).read_text().splitlines()]
    assert {"key": key, "first": True} | {"payload": {"n": 1}} == {
        k: lines[-1][k] for k in ("key", "first", "payload")
    }


def test_a_redelivered_webhook_id_counts_raw_but_not_unique(receiver: dict[str, Any]) -> None:
    before = stats(receiver)
    body, headers = signed({"invoice": "A-1"}, "key-redelivered")
    assert post(receiver["url"] + "/h", body, headers)[1]["duplicate"] is False
    assert post(receiver["url"] + "/h", body, headers)[1]["duplicate"] is True
    after = stats(receiver)
    assert after["raw"] - before["raw"] == 2
    assert after["unique"] - before["unique"] == 1
    assert after["duplicates"] - before["duplicates"] == 1


def test_a_tampered_body_is_rejected_and_not_received(receiver: dict[str, Any]) -> None:
    before = stats(receiver)
    body, headers = signed({"amount": 10}, "key-tampered")
    status, _ = post(receiver["url"] + "/h", body.replace(b"10", b"99"), headers)
    assert status == 401
    after = stats(receiver)
    assert after["bad_signatures"] - before["bad_signatures"] == 1
    assert after["raw"] == before["raw"]


def test_a_request_signed_with_another_secret_is_rejected(receiver: dict[str, Any]) -> None:
    body, headers = signed({"a": 1}, "key-other-secret", secret=generate_signing_secret())
    assert post(receiver["url"] + "/h", body, headers)[0] == 401
    assert post(receiver["url"] + "/h", body, {"content-type": "application/json"})[0] == 401


def test_the_reject_path_answers_400_after_verifying(receiver: dict[str, Any]) -> None:
    before = stats(receiver)
    status, answer = post(receiver["url"] + "/reject", *signed({"a": 1}, "key-reject"))
    assert status == 400
    assert "refuses" in answer["error"]
    assert stats(receiver)["rejected"] - before["rejected"] == 1


def test_failures_are_deterministic_by_seed_and_retries_get_through() -> None:
    keys = [f"key-{i}" for i in range(40)]
    predicted = {k for k in keys if fails(7, k, 0, 0.5)}
    assert 5 < len(predicted) < 35  # the rate is honoured, roughly
    with outbox_process(
        "receiver", "serve", "--port", "0", "--fail-rate", "0.5", "--seed", "7",
        env={"OUTBOX_RECEIVER_SECRET": SECRET},
    ) as (_, info):  # fmt: skip
        first = {k for k in keys if post(info["url"] + "/h", *signed({}, k))[0] == 500}
        assert first == predicted
        for k in first:  # a retry draws again: within a few tries every key gets through
            assert any(post(info["url"] + "/h", *signed({}, k))[0] == 200 for _ in range(20))
        final = stats(info)
    assert final["unique"] == len(keys)
    assert final["failed_on_purpose"] >= len(predicted)


def test_a_bad_fail_rate_is_refused_with_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    from spark_outbox.cli.main import main

    assert main(["receiver", "serve", "--port", "0", "--fail-rate", "5"]) == 2
    assert "fail rate 5.0 is not in [0, 1]; give e.g. 0.05" in capsys.readouterr().err
