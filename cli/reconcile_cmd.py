"""``outbox reconcile JOB [BATCH] [--json]``: every batch's rows, effects and deliveries,
and its result rows against the results table now, each difference explained, the
unexplained named; exit 1 when anything is unexplained (dispatcher/console/reconcile.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from spark_outbox.cli import output
from spark_outbox.cli.database import engine_for
from spark_outbox.console import reconcile, results
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser(
        "reconcile", help="per batch: result rows <-> effects <-> deliveries, explained"
    )
    p.add_argument("job")
    p.add_argument("batch_id", nargs="?", help="one batch (default: the job's newest batches)")
    p.add_argument("--limit", type=int, default=100, help="newest batches to check (default 100)")
    p.add_argument("--json", action="store_true", help="one JSON object per batch, per line")
    p.set_defaults(handler=run)


def render(r: reconcile.BatchReconciliation) -> list[str]:
    lines = [
        f"{r.job} / {r.batch_id}  committed {r.committed_at.isoformat()}  "
        f"result rows {r.result_rows}  effect rows {r.effect_rows}  attempts {r.attempts}"
    ]
    for line in r.lines:
        mark = "  " if line.explained else "!!"
        lines.append(f"  {mark} {line.category:21} {line.count:8}  {line.meaning}")
    if r.payload_mismatches:
        lines.append(f"     ({r.payload_mismatches} deduplicated row(s) had another payload)")
    if r.foreign_keys:
        lines.append(f"     foreign effect keys: {', '.join(r.foreign_keys)}")
    lines += _results(r.results)
    verdict = "every row explained" if not r.unexplained else f"UNEXPLAINED: {r.unexplained}"
    lines.append(f"     {verdict}")
    return lines


def _results(check: results.ResultsCheck) -> list[str]:
    """The result rows against the table now, unexplained ones named by key."""
    if check.table is None and not check.cannot_know:
        return []
    lines = [f"  result rows in {check.table or '?'}: {check.recorded} recorded"]
    for line in check.lines:
        mark = "  " if line.explained else "!!"
        lines.append(f"  {mark} {line.category:21} {line.count:8}  {line.meaning}")
        if not line.explained:
            lines += [f"       {output.dumps(key)}" for key in line.keys]
    lines += [f"     cannot know: {note}" for note in check.cannot_know]
    return lines


def run(args: argparse.Namespace, settings: Settings) -> int:
    engine = engine_for(settings)
    try:
        with engine.connect() as conn:
            if args.batch_id is not None:
                found = [reconcile.batch(conn, args.job, args.batch_id)]
            else:
                found = reconcile.job(conn, args.job, limit=args.limit)
    finally:
        engine.dispose()
    if not found:
        print(f"no committed batch of job {args.job!r}", file=sys.stderr)
    for r in found:
        if args.json:
            print(output.dumps(reconcile.as_dict(r)))
        else:
            print("\n".join(render(r)))
    return 1 if any(r.unexplained for r in found) else 0
