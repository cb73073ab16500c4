"""The demo's final report: every number read back from the database and the receivers.

``collect`` gathers them into one JSON-able dict (``--report-json`` writes it,
the test parses it); ``render`` prints it for a person; ``checks`` states the
laws the numbers must obey, so a broken run says so instead of looking fine.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Engine

from spark_outbox.cli.demo import receivers, tally
from spark_outbox.console import reconcile

WEBHOOK = "billing-webhook"
EMAIL = "billing-email"
STATES = ("delivered", "dead", "pending", "leased", "cancelled", "uncertain")


def collect(engine: Engine, recv: receivers.Receivers) -> dict[str, Any]:
    with engine.connect() as conn:
        by_endpoint = tally.effects_by_endpoint(conn)
        attempts = tally.attempts_by_endpoint(conn)
        retried = tally.retried_effects(conn)
        report: dict[str, Any] = {
            "batches": tally.batches_by_job(conn),
            "result_rows": tally.invoice_digest(conn).rows,
            "rejects": tally.reject_count(conn),
            "reject_reasons": tally.reject_reasons(conn),
            "dead_letters": tally.dead_letters(conn),
            "reconciliation": reconciliation(conn),
        }
    endpoints = {}
    for name in sorted(set(by_endpoint) | set(attempts)):
        states = {s: by_endpoint.get(name, {}).get(s, 0) for s in STATES}
        endpoints[name] = {
            "enqueued": sum(by_endpoint.get(name, {}).values()),
            **states,
            "retried": retried.get(name, 0),
            "attempts": attempts.get(name, {}),
        }
    totals = {k: sum(int(e[k]) for e in endpoints.values()) for k in ("enqueued", *STATES)}
    totals["retried"] = sum(retried.values())
    totals["attempts"] = sum(sum(a.values()) for a in attempts.values())
    report |= {
        "effects": totals,
        "endpoints": endpoints,
        "receiver": receivers.stats(recv.webhook_url),
        "mailcatcher": receivers.stats(recv.catcher_url),
    }
    report["checks"] = checks(report)
    return report


def reconciliation(conn: Any, job: str = "billing") -> dict[str, Any]:
    """Every batch of the job reconciled (dispatcher/console/reconcile.py), summed by category."""
    found = reconcile.job(conn, job, limit=500)
    totals: dict[str, int] = {}
    for r in found:
        for line in r.lines:
            totals[line.category] = totals.get(line.category, 0) + line.count
    return {
        "batches": len(found),
        "categories": {k: v for k, v in totals.items() if v},
        "unexplained": sum(r.unexplained for r in found),
    }


def checks(r: dict[str, Any]) -> dict[str, bool]:
    e = r["effects"]
    hook = r["endpoints"].get(WEBHOOK, {"delivered": 0})
    mail = r["endpoints"].get(EMAIL, {"delivered": 0})
    return {
        "delivered + dead + pending + cancelled + uncertain = enqueued": e["delivered"]
        + e["dead"]
        + e["pending"]
        + e["leased"]
        + e["cancelled"]
        + e["uncertain"]
        == e["enqueued"],
        "nothing left pending": e["pending"] + e["leased"] == 0,
        "receiver unique = webhooks delivered": r["receiver"]["unique"] == hook["delivered"],
        "catcher unique = e-mails delivered": r["mailcatcher"]["unique"] == mail["delivered"],
        "receiver raw >= unique": r["receiver"]["raw"] >= r["receiver"]["unique"],
        "no bad signatures": r["receiver"]["bad_signatures"] == 0,
        "every batch reconciles (nothing unexplained)": r["reconciliation"]["unexplained"] == 0,
    }


def render(r: dict[str, Any]) -> str:
    e, rc, mc = r["effects"], r["receiver"], r["mailcatcher"]
    lines = ["", "=" * 72, "spark-outbox demo: final report", "=" * 72]
    for b in r["batches"]:
        lines.append(
            f"job {b['job']}: {b['batches']} committed batches, {b['result_rows']:,} result rows, "
            f"{b['effects_new']:,} effects new, {b['effects_deduplicated']:,} deduplicated, "
            f"{b['rejects']:,} rejects"
        )
    lines.append(f"invoices in the results table: {r['result_rows']:,}")
    recon = r["reconciliation"]
    parts = ", ".join(f"{k} {v:,}" for k, v in recon["categories"].items())
    lines.append(
        f"reconciliation of {recon['batches']} batches: {parts}; "
        f"unexplained {recon['unexplained']:,}"
    )
    lines.append(f"rejected rows kept with their reason: {r['rejects']:,}")
    lines += [f"    {n:,} x {reason}" for reason, n in r["reject_reasons"]]
    lines.append(
        f"effects enqueued {e['enqueued']:,}: delivered {e['delivered']:,}, dead {e['dead']:,}, "
        f"pending {e['pending'] + e['leased']:,}, cancelled {e['cancelled']:,}, "
        f"uncertain {e['uncertain']:,}"
    )
    lines.append(
        f"retried: {e['retried']:,} effects needed a retry; {e['attempts']:,} attempts in all"
    )
    for name, ep in r["endpoints"].items():
        attempts = ", ".join(f"{k} {v:,}" for k, v in sorted(ep["attempts"].items()))
        lines.append(
            f"  {name:16} enqueued {ep['enqueued']:,}, delivered {ep['delivered']:,}, "
            f"dead {ep['dead']:,}, retried {ep['retried']:,} (attempts: {attempts or 'none'})"
        )
    for d in r["dead_letters"]:
        lines.append(
            f"  dead letter {d['idempotency_key'][:12]}… on {d['endpoint']} after "
            f"{d['attempt_count']} attempt(s): {d['last_error']}"
        )
    lines.append(
        f"webhook receiver: raw {rc['raw']:,}, unique {rc['unique']:,}, duplicates "
        f"{rc['duplicates']:,}, failed on purpose {rc['failed_on_purpose']:,}, bad signatures "
        f"{rc['bad_signatures']:,}, refused (400) {rc['rejected']:,}"
    )
    lines.append(
        f"SMTP catcher: raw {mc['raw']:,}, unique {mc['unique']:,}, duplicates "
        f"{mc['duplicates']:,}, failed on purpose (451) {mc['failed_on_purpose']:,}"
    )
    if "crash" in r:
        lines += render_crash(r["crash"])
    lines.append("time per stage:")
    lines += [f"  {s['name']:34} {s['seconds']:7.1f} s" for s in r["stages"]]
    lines.append(f"  {'total':34} {sum(s['seconds'] for s in r['stages']):7.1f} s")
    lines += [f"note: {n}" for n in r.get("notes", [])]
    lines.append("checks:")
    lines += [f"  [{'ok' if ok else 'FAILED'}] {name}" for name, ok in r["checks"].items()]
    return "\n".join(lines)


def render_crash(c: dict[str, Any]) -> list[str]:
    lines = ["crash test:"]
    lines += [f"  {event}" for event in c["events"]]
    lines.append(
        f"  invoices: {c['invoices']['rows']:,} rows, digest {c['invoices']['digest'][:12]}…; "
        f"clean run: {c['clean_invoices']['rows']:,} rows, digest "
        f"{c['clean_invoices']['digest'][:12]}…"
    )
    lines.append(
        f"  expected webhook effects (clean run): {c['expected_webhooks']:,}; receiver unique "
        f"receipts: {c['receiver_unique']:,}; same keys: {c['same_keys']}"
    )
    return lines
