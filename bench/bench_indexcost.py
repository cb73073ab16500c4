"""What the effects table's indexes cost a claim (issue 31 items 1 and 2).

A claim leases its rows with an UPDATE that no index lets be HOT (``state`` is in
partial indexes' predicates), so every claimed row gets a new entry in every index of
``effects`` whose predicate it meets, the audit indexes (by endpoint, state, batch,
recipient, reference) and the key's unique index included, though the claim reads
none of them. Loads ``--due`` due effects (with recipients, references and batches,
so those indexes hold them) into one database, then per round clones it once per
variant, drops that variant's indexes in the clone, and times ``--claims`` claims of
``--limit`` (``store.claim``, the dispatcher's engine); rounds interleave the
variants; medians.

    python -m bench indexcost -- [--due 300000] [--claims 12] [--limit 500] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import sqlalchemy as sa

from bench.payload import PAD
from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools import scratch
from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from spark_outbox.core.settings import Settings
from spark_outbox.dispatch import store

AUDIT = (
    "ix_effects_state_created_at_id",
    "ix_effects_endpoint_created_at_id",
    "ix_effects_job_batch_id_created_at_id",
    "ix_effects_recipient_created_at_id",
    "ix_effects_reference_created_at_id",
)
# Variant -> what its clone drops ("*": every index but the two a claim reads).
VARIANTS: dict[str, tuple[str, ...]] = {
    "all 16 indexes (today)": (),
    "without the 5 audit indexes": AUDIT,
    "without them and the key's unique index": (*AUDIT, "uq_effects_idempotency_key"),
    "only pk_effects and ix_effects_due": ("*",),
}
_LOAD = (
    "INSERT INTO effects (idempotency_key, endpoint, payload, payload_sha256, next_attempt_at,"
    " recipient, reference, job, batch_id)"
    " SELECT md5(g::text) || md5((g + 1)::text), 'bench', jsonb_build_object('n', g, 'pad', :pad),"
    " 'x', now() - interval '1 hour', 'user' || (g % 50000) || '@example.com', 'INV-' || g,"
    " 'billing', 'b-' || (g / 1000) FROM generate_series(1, :n) g"
)


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench indexcost", description=__doc__)
    p.add_argument("--due", type=int, default=300_000)
    p.add_argument("--claims", type=int, default=12, help="timed claims per variant and round")
    p.add_argument("--limit", type=int, default=500, help="rows per claim")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args(argv)


def _load(server_url: str, due: int) -> str:
    url = scratch.clone_template(server_url, scratch.ensure_template(server_url), prefix="ix")
    engine = db.create_engine(url, pool_size=1, **store.ENGINE_OPTIONS)
    try:
        with engine.connect() as conn:
            add_webhook(conn, name="bench", url="http://127.0.0.1:9/h")
            conn.execute(sa.text(_LOAD), {"n": due, "pad": PAD})
            conn.execute(sa.text("VACUUM ANALYZE effects"))
    finally:
        engine.dispose()
    return url


def _variant(
    server_url: str, loaded: str, drops: tuple[str, ...], args: argparse.Namespace
) -> float:
    """The median claim (ms) on a clone of ``loaded`` without ``drops``."""
    url = scratch.clone_template(server_url, scratch.database_name(loaded), prefix="ixv")
    engine = db.create_engine(url, pool_size=1, **store.ENGINE_OPTIONS)
    try:
        with engine.connect() as conn:
            names = drops
            if drops == ("*",):
                every = conn.execute(
                    sa.text("SELECT indexname FROM pg_indexes WHERE tablename = 'effects'")
                ).scalars()
                names = tuple(n for n in every if n not in ("pk_effects", "ix_effects_due"))
            for name in names:
                if name.startswith("uq_"):  # a constraint's index
                    conn.execute(sa.text(f"ALTER TABLE effects DROP CONSTRAINT {name}"))
                else:
                    conn.execute(sa.text(f"DROP INDEX {name}"))
        store.claim(engine, "warm-up", args.limit, 600.0)
        took = []
        for _ in range(args.claims):
            started = time.perf_counter()
            got = store.claim(engine, "bench", args.limit, 600.0)
            took.append((time.perf_counter() - started) * 1000)
            assert len(got) == args.limit, f"claimed {len(got)} of {args.limit}"
        return statistics.median(took)
    finally:
        engine.dispose()
        scratch.drop_database(server_url, scratch.database_name(url))


def main(argv: list[str]) -> int:
    args = _parse(argv)
    root = Path(__file__).resolve().parents[1]
    server_url = database_url(Settings.from_env(state_dir=root / ".outbox"))
    loaded = _load(server_url, args.due)
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}; {args.due:,} due effects", flush=True)
    try:
        found: dict[str, list[float]] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
            for name in order:
                found[name].append(_variant(server_url, loaded, VARIANTS[name], args))
            print(f"round {r + 1}: " + ", ".join(f"{n} {found[n][-1]:.1f} ms" for n in VARIANTS))
        base = statistics.median(found["all 16 indexes (today)"])
        print(
            f"claims of {args.limit}, median of {args.rounds} rounds ({args.claims} claims each):"
        )
        for name, samples in found.items():
            ms = statistics.median(samples)
            print(
                f"  {name:44} {ms:7.1f} ms  {ms / args.limit * 1000:5.0f} us a row"
                f"  {ms / base:5.2f}x today's"
            )
    finally:
        scratch.drop_database(server_url, scratch.database_name(loaded))
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}")
    return 0
