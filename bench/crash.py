"""The crash window, measured: ``kill -9`` a dispatcher at its defaults mid-drain, again
and again, and count what each kill costs.

A kill loses what was sent but not yet recorded. To an endpoint that deduplicates
(a webhook) that effect is sent again once its lease expires: a **re-send** (the
receiver sees its key twice). To one that cannot (e-mail) its started send ends
**uncertain** for an operator. Each drill:

1. enqueues N effects for one endpoint;
2. ``kills`` times: starts ``outbox dispatcher run`` with no options (a supervisor
   and one worker per core, every default), lets it send for a while (the delays
   cycle through ``DELAYS_S``), ``kill -9``s the supervisor (its workers die with
   it) and waits until their connections are gone; then expires the dead workers'
   leases at once (what their 60-s leases would do a minute later);
3. drains the rest with a last dispatcher, stopped by SIGTERM.

Webhooks go to the receiver's ``/lat``, which notes every arrival's ``webhook-id``:
re-sends = arrivals beyond the first of each key. E-mails go to an SMTP server in
this process that notes each ``Message-ID``: uncertain effects are counted, and
split into those the server did receive (really on the wire) and those it never
saw (false alarms: killed after the start was recorded, before the message went out).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from aiosmtpd.controller import Controller

from bench import contenders
from bench.database import insert_effects
from spark_outbox.cli.tools.scratch import free_port
from spark_outbox.core import wakeup
from spark_outbox.core.endpoints import add_email

DELAYS_S = (0.3, 0.6, 0.9, 1.2)

_MAILS = """
INSERT INTO effects (idempotency_key, endpoint, recipient, payload, payload_sha256)
SELECT lpad(to_hex(g), 64, '0'), 'crash-mail', 'c' || g || '@example.com',
       jsonb_build_object('subject', 'Invoice ' || g, 'text', 'Your invoice ' || g), 'x'
FROM generate_series(1, :n) g
"""


@dataclasses.dataclass(frozen=True)
class Run:
    """How the dispatcher runs: ``dispatcher run`` options (none: the defaults, what the
    drill is for) and the checkout it runs from (an A/B of two commits)."""

    options: tuple[str, ...] = ()
    code: Path = contenders.ROOT

    def __str__(self) -> str:
        where = "" if self.code == contenders.ROOT else f" (code {self.code})"
        return f"`outbox dispatcher run{''.join(' ' + o for o in self.options)}`{where}"


@dataclasses.dataclass(frozen=True)
class Drill:
    kills: int
    effects: int
    delivered: int
    resent: int  # arrivals beyond the first of a key
    uncertain: int
    uncertain_received: int  # uncertain, and the receiver has it


class _Mailbox:
    """Notes the Message-ID of every message accepted (thread-safe enough: appends)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        for line in bytes(envelope.content).split(b"\r\n"):
            if line.lower().startswith(b"message-id:"):
                self.ids.append(line.split(b":", 1)[1].strip().decode())
                break
        return "250 OK"


@contextmanager
def smtp_server() -> Iterator[tuple[int, _Mailbox]]:
    box = _Mailbox()
    port = free_port()
    controller = Controller(box, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, box
    finally:
        controller.stop()


def _arrivals(base: str) -> list[str]:
    """The keys that reached ``/lat`` since the last call (the receiver forgets them)."""
    with urllib.request.urlopen(f"{base}/arrivals", timeout=30) as resp:  # noqa: S310
        return [key for key, _ in json.loads(resp.read())]


def _connections_gone(engine: sa.Engine) -> bool:
    sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'outbox-dispatcher'"
    return contenders._scalar(engine, sql) == 0


def _kill_all(ctx: contenders.Ctx, kills: int, run: Run) -> None:
    """``kills`` times: a dispatcher at its defaults, killed -9 mid-drain; leases expired."""
    for k in range(kills):
        proc = contenders.start_dispatchers(ctx, 0, *run.options, code=run.code)
        time.sleep(DELAYS_S[k % len(DELAYS_S)])
        proc.kill()  # the supervisor; its workers die with it (PR_SET_PDEATHSIG)
        proc.wait(10)
        contenders._wait(lambda: _connections_gone(ctx.engine), 30, "the killed workers' exit")
        with ctx.engine.begin() as conn:
            # What the leases' expiry does a minute later, now (the drill's only shortcut).
            leased = conn.execute(
                sa.text(
                    "UPDATE effects SET next_attempt_at = now(), lease_expires_at = now()"
                    " WHERE state = 'leased'"
                )
            ).rowcount
            wakeup.notify(conn, "bench")
        print(f"kill {k + 1}: {leased} effects were under lease", flush=True)


def _drain(ctx: contenders.Ctx, run: Run) -> None:
    proc = contenders.start_dispatchers(ctx, 0, *run.options, code=run.code)
    try:
        unfinished = "FROM effects WHERE state IN ('pending', 'leased')"
        contenders._wait(lambda: contenders._drained(ctx.engine, unfinished), 600, "drain")
    finally:
        contenders.stop_all([proc])


def _count(engine: sa.Engine, state: str) -> int:
    return contenders._scalar(engine, f"SELECT count(*) FROM effects WHERE state = '{state}'")


def webhooks(ctx: contenders.Ctx, n: int, kills: int, run: Run) -> Drill:
    """Re-sends per kill to a deduplicating webhook endpoint (the bench's ``lat``)."""
    contenders._reset(ctx.engine)
    _arrivals(ctx.lat_base or ctx.base)  # forget earlier ones
    insert_effects(ctx.engine, n, "lat")
    _kill_all(ctx, kills, run)
    _drain(ctx, run)
    seen = collections.Counter(_arrivals(ctx.lat_base or ctx.base))
    return Drill(kills, n, _count(ctx.engine, "delivered"), sum(seen.values()) - len(seen), 0, 0)


def emails(ctx: contenders.Ctx, n: int, kills: int, run: Run) -> Drill:
    """Uncertain effects per kill to an e-mail endpoint that cannot deduplicate."""
    contenders._reset(ctx.engine)
    with smtp_server() as (port, box):
        with ctx.engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM endpoints WHERE name = 'crash-mail'"))
            add_email(
                conn,
                name="crash-mail",
                smtp_host="127.0.0.1",
                smtp_port=port,
                mail_from="bench@example.com",
            )
            conn.execute(sa.text(_MAILS), {"n": n})
            wakeup.notify(conn, "bench")
        _kill_all(ctx, kills, run)
        _drain(ctx, run)
        received = {mid.strip("<>").split("@")[0] for mid in box.ids}
        resent = len(box.ids) - len(received)
    with ctx.engine.connect() as conn:
        uncertain = list(
            conn.execute(
                sa.text("SELECT idempotency_key FROM effects WHERE state = 'uncertain'")
            ).scalars()
        )
    return Drill(
        kills,
        n,
        _count(ctx.engine, "delivered"),
        resent,
        len(uncertain),
        sum(1 for key in uncertain if key in received),
    )


def report(what: str, drill: Drill, run: Run) -> str:
    per_kill = f"{drill.resent / drill.kills:.1f} re-sends per kill"
    if what == "e-mail":
        per_kill += (
            f", {drill.uncertain / drill.kills:.1f} uncertain per kill "
            f"({drill.uncertain_received} of {drill.uncertain} uncertain were received)"
        )
    return (
        f"crash window, {what}: {drill.kills} kill -9 of {run}"
        f" over {drill.effects:,} effects: {drill.delivered:,} delivered, {drill.resent} re-sent, "
        f"{drill.uncertain} uncertain: {per_kill}"
    )


def run(
    ctx: contenders.Ctx, kills: int, webhook_n: int, email_n: int, how: Run | None = None
) -> list[Drill]:
    """Both drills, printed as they end; ``how``: the defaults unless told."""
    how = how or Run()
    done = []
    drills: list[tuple[str, Callable[[contenders.Ctx, int, int, Run], Drill], int]] = [
        ("webhook", webhooks, webhook_n),
        ("e-mail", emails, email_n),
    ]
    for what, drill, n in drills:
        if n <= 0:
            continue
        result = drill(ctx, n, kills, how)
        print(report(what, result, how), flush=True)
        done.append(result)
    return done
