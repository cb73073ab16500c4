"""The volume guard in the demo: an outsized day is held, then an operator releases it.

The batch run bills one extra day with twice the customers (a bad join, say).
The demo runs that job with a low bar (1.5 times the median of the days billed
before: ``guard_args``) so a small demo shows it without many extra
deliveries. The day commits but is held: while the dispatchers drain
everything else, none of its effects is sent. Then ``outbox batches release``
counts it (``--dry-run``) and releases it, with a reason kept in the operator
actions, and the drain delivers it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import tally
from spark_outbox.cli.demo.procs import run_step
from spark_outbox.cli.demo.progress import say
from spark_outbox.console import holds

JOB = "billing"
CUSTOMERS_FACTOR = 2  # the outsized day's customers, times the usual
REASON = "demo: the peak is real, checked with the billing team"


def guard_args(batch_days: int) -> list[str]:
    """The batch job's guard for the demo: a baseline after the first days, bar at 1.5x."""
    return ["--guard-factor", "1.5", "--guard-min-batches", str(batch_days),
            "--guard-min-effects", "1"]  # fmt: skip


def checks(found: dict[str, Any]) -> dict[str, bool]:
    """The laws of the stage: held, nothing of it sent while held, then released."""
    return {
        "the volume guard held the outsized day": bool(found.get("held")),
        "nothing of the held day was sent while it was held": not {"delivered", "leased", "dead"}
        & set(found.get("states_while_held", {})),
        "the operator's release let the held day go": found.get("released", 0) > 0,
    }


def hold_and_release(
    engine: Engine, env: Mapping[str, str], logs: Path, batch_id: str
) -> dict[str, Any]:
    with engine.connect() as conn:
        held = [b for b in holds.held_batches(conn) if (b.job, b.batch_id) == (JOB, batch_id)]
        states = tally.batch_states(conn, JOB, batch_id)
    found: dict[str, Any] = {"batch_id": batch_id, "held": bool(held), "states_while_held": states}
    if not held:
        say(f"    {JOB} / {batch_id} was NOT held")
        return found
    found["reason"] = held[0].hold_reason
    say(f"    {JOB} / {batch_id} committed but held: {held[0].hold_reason}")
    say(f"    its effects while held, the dispatchers running: {states}")
    command = ["batches", "release", JOB, batch_id, "--reason", REASON]
    dry = run_step("batches-release-dry-run", [*command, "--dry-run"], env, logs)
    say(f"    $ outbox {' '.join(command[:4])} --reason '...' --dry-run")
    say(f"      {dry.output().strip()}")
    done = run_step("batches-release", [*command, "--json"], env, logs)
    found["released"] = json.loads(done.output())["effects"]
    say(f"    $ outbox {' '.join(command[:4])} --reason '...'")
    say(f"      released {found['released']} effect(s); the drain delivers them")
    return found
