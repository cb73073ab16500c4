"""Spark -> PostgreSQL: the atomic outbox sink vs Spark's JDBC append vs raw COPY.

``python -m bench sink`` (defaults: 1,000,000 rows; 2 and 4 partitions; on
``local[N]`` with N = partitions, and on a private standalone cluster of two
workers, N/2 cores each, started from the installed PySpark). The same rows
(key, endpoint, recipient, ~230-byte JSON payload) go into the same indexed
``effects`` table three ways, on a fresh migrated database, each after a
TRUNCATE and a CHECKPOINT; within one configuration every path first runs once untimed
(``--warmup``: the JDBC writer's JIT-compiled JVM code and the sink's Python
workers with their imports are then warm alike), then the three paths run in
interleaved rounds (drift hits all alike) and the table shows medians and
ratios to the JDBC append of the same configuration:

- sink: ``OutboxSink.write`` end to end: executors insert effects straight
  into the outbox (invisible), the one commit transaction makes them visible;
  atomic, deduplicated, replay-safe;
- jdbc: Spark's JDBC writer, append, ``reWriteBatchedInserts=true``, batchsize 10000
  (each partition commits on its own: not atomic, no dedup);
- copy: one psycopg2 ``COPY`` of the same rows from a CSV file (one stream, the raw path);
- JVM COPY: the ceiling, the fastest Spark writer this machine runs: each
  partition streams its rows into one binary COPY from the executor's JVM
  (bench/jvm/CopyWriter.java, compiled at start with the JDK's ``javac``
  against the installed PySpark; the path is left out without one); no Python,
  no checks, no dedup, no marker;
- executor COPY: the ceiling of any Spark writer that hands rows to Python (the
  gap from the sink to it, in wall time and CPU per row, is printed under each
  configuration: the price of the guarantee):
  every partition binary-COPYs its Arrow batches (spark_outbox.spark.pgbinary, no
  per-row Python) straight into ``effects`` and commits on its own; no checks,
  no canonical JSON, no dedup, no marker. A sink doing the same write plus
  those cannot beat it.

Each path's timed part also counts CPU seconds from /proc (bench.cpu): the
Spark side (this process and every descendant: the JVM, its Python workers, a
cluster's master, workers and executors) and the private PostgreSQL cluster;
on a shared machine these say where the work goes better than the wall clock.

``--postgres-cores N``: PostgreSQL (the postmaster and every backend, which
inherit it) pinned to the last N cores and this process with all it starts
(the JVMs, Python workers, a cluster) to the others: the shape of a deployment
where the database has its own host, instead of everything sharing every core.

``--valves``: instead, the sink with the volume guard on (the default) vs off
(``VolumeGuard.off()``), side by side in interleaved rounds, each after 20
earlier markers of the job were written (a baseline to read); ratios to "off".
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg2

from bench import cpu

JAR = Path("/usr/share/java/postgresql.jar")


@dataclasses.dataclass(frozen=True)
class Timed:
    """One path's timed part: wall seconds, and CPU seconds of the Spark side (this
    process, its JVM, Python workers, a cluster's executors) and of PostgreSQL."""

    seconds: float
    client_cpu_s: float
    postgres_cpu_s: float | None
    note: str


class _Clock:
    def __init__(self) -> None:
        self.postmaster = cpu.postmaster_pid()
        self.started = time.perf_counter()
        self.client = cpu.TreeMeter(os.getpid())
        self.postgres = cpu.postgres_seconds(self.postmaster)

    def stop(self, note: str) -> Timed:
        seconds = time.perf_counter() - self.started
        client = self.client.stop()
        pg = cpu.postgres_seconds(self.postmaster)
        used = None if pg is None or self.postgres is None else pg - self.postgres
        return Timed(seconds, client, used, note)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench sink", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="default: 1000000")
    parser.add_argument(
        "--partitions", default="2,4", help="comma-separated partition counts (default: 2,4)"
    )
    parser.add_argument(
        "--masters", default="local,cluster", help="local[N] and/or cluster (default: both)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved rounds; medians shown (default: 3)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed rounds of every path first, in each session (default: 1)",
    )
    parser.add_argument(
        "--valves", action="store_true", help="the sink with the volume guard on vs off"
    )
    parser.add_argument(
        "--postgres-cores",
        type=int,
        default=0,
        help="pin PostgreSQL to the last N cores, Spark to the rest (default 0: shared)",
    )
    args = parser.parse_args(argv)
    if not _ensure_jdbc_jar():
        print(f"no JDBC driver at {JAR}: apt-get install libpostgresql-jdbc-java")
        return 2
    from spark_outbox.cli.database import database_url
    from spark_outbox.core.settings import Settings

    if not _build_ceiling():
        print("no javac here: the JVM COPY ceiling is left out", flush=True)
    server = database_url(Settings.from_env())
    url = _fresh_database(server)
    if args.postgres_cores:
        print(_pin(args.postgres_cores), flush=True)
    print(f"load at start: {_uptime()}", flush=True)
    table: list[str] = []
    try:
        for master in args.masters.split(","):
            for partitions in (int(p) for p in args.partitions.split(",")):
                table += _configuration(url, master, partitions, args)
    finally:
        _drop_database(server, url)
        _CEILING_JAR.unlink(missing_ok=True)
    print(f"load at end: {_uptime()}")
    print(
        f"\n{args.rows:,} rows into the indexed effects table, median of {args.repeat} "
        "interleaved round(s) per configuration; spark us / pg us: median CPU microseconds per "
        "row of the Spark side (driver, JVMs, Python workers, executors) and of PostgreSQL; "
        f"cpu vs: {'off' if args.valves else 'jdbc'}'s total CPU per row / this path's"
    )
    print(
        f"{'master':<10}{'parts':>6}  {'path':<22}{'seconds':>9}{'range':>13}{'rows/s':>10}"
        f"{'vs off' if args.valves else 'vs jdbc':>9}{'spark us':>10}{'pg us':>7}"
        f"{'cpu vs':>8}  note"
    )
    print("\n".join(table))
    return 0


def _configuration(url: str, master: str, partitions: int, args: argparse.Namespace) -> list[str]:
    paths: dict[str, Callable[[str, Any], Timed]] = {
        "sink (atomic)": _time_sink,
        "spark jdbc append": _time_jdbc,
        "raw COPY (1 stream)": _time_copy,
        "executor COPY (Python)": _time_executor_copy,
    }
    if _CEILING_JAR.exists():
        paths["JVM COPY (ceiling)"] = _time_jvm_copy
    base_path = "spark jdbc append"
    if args.valves:
        paths = {"sink, guard on": _time_guarded, "sink, guard off": _time_unguarded}
        base_path = "sink, guard off"
    runs: dict[str, list[Timed]] = {name: [] for name in paths}
    with _session(master, partitions) as (spark, label):
        rows = _rows(spark, args.rows, partitions)
        _register_endpoint(url)
        for _ in range(args.warmup):  # every path alike: JDBC's JIT, the Python workers' imports
            for name, time_path in paths.items():
                warm = time_path(url, rows)
                print(f"{label} x{partitions} warm-up: {name}: {warm.seconds:.2f} s", flush=True)
        for round_ in range(1, args.repeat + 1):
            for name, time_path in paths.items():  # interleaved: drift hits every path alike
                runs[name].append(time_path(url, rows))
                done = runs[name][-1]
                print(
                    f"{label} x{partitions} round {round_}: {name}: {done.seconds:.2f} s, "
                    f"CPU s: spark side {done.client_cpu_s:.1f}, postgres "
                    f"{_fmt(done.postgres_cpu_s, '.1f')}",
                    flush=True,
                )
        rows.unpersist()
    median = {name: statistics.median(t.seconds for t in results) for name, results in runs.items()}
    if args.valves:  # within each round, side by side: the machine is shared
        on, off = runs["sink, guard on"], runs["sink, guard off"]
        ratios = [o.seconds / g.seconds for g, o in zip(on, off, strict=True)]
        print(f"guard on / off rows/s per round: {[round(r, 2) for r in ratios]}; "
              f"median {statistics.median(ratios):.2f}", flush=True)  # fmt: skip
    base = args.rows / median[base_path]
    us = {name: _cpu_us(results, args.rows) for name, results in runs.items()}
    base_cpu = sum(us[base_path])
    lines = []
    for name, results in runs.items():
        seconds = [t.seconds for t in results]
        rate = args.rows / median[name]
        spread = f"{min(seconds):.1f}-{max(seconds):.1f}"
        client_us, pg_us = us[name]
        lines.append(
            f"{label:<10}{partitions:>6}  {name:<22}{median[name]:>9.2f}{spread:>13}{rate:>10,.0f}"
            f"{rate / base:>9.2f}{client_us:>10.1f}{pg_us:>7.1f}"
            f"{base_cpu / (client_us + pg_us):>8.2f}  {results[-1].note}"
        )
    ceiling = "executor COPY (Python)"
    if "sink (atomic)" in runs and ceiling in runs:
        lines.append(_price(label, partitions, median, us, ceiling))
    return lines


def _price(
    label: str,
    partitions: int,
    median: dict[str, float],
    us: dict[str, tuple[float, float]],
    ceiling: str,
) -> str:
    """The gap between the sink and the executor COPY ceiling (the same write without
    checks, canonical JSON, dedup or marker): the price of the guarantee."""
    (sink_spark, sink_pg), (top_spark, top_pg) = us["sink (atomic)"], us[ceiling]
    return (
        f"{label:<10}{partitions:>6}  price of the guarantee (sink vs {ceiling}): "
        f"{median['sink (atomic)'] / median[ceiling]:.2f}x the wall time, "
        f"{sink_spark + sink_pg - top_spark - top_pg:+.1f} us CPU per row "
        f"(spark {sink_spark - top_spark:+.1f}, postgres {sink_pg - top_pg:+.1f})"
    )


def _pin(postgres_cores: int) -> str:
    """PostgreSQL's processes onto the last ``postgres_cores`` cores, this process (and
    so every process it starts later) onto the others."""
    cores = sorted(os.sched_getaffinity(0))
    if not 0 < postgres_cores < len(cores):
        raise SystemExit(f"--postgres-cores {postgres_cores}: this machine has {len(cores)}")
    database, spark = set(cores[-postgres_cores:]), set(cores[:-postgres_cores])
    postmaster = cpu.postmaster_pid()
    if postmaster is None:
        raise SystemExit("--postgres-cores needs the private cluster (unset DATABASE_URL)")
    pinned = [postmaster] + [
        int(pid)
        for pid in Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    ]
    for pid in pinned:
        os.sched_setaffinity(pid, database)
    os.sched_setaffinity(0, spark)
    return (
        f"pinned: PostgreSQL ({len(pinned)} processes) to cores {sorted(database)}, "
        f"Spark to cores {sorted(spark)}"
    )


def _cpu_us(results: list[Timed], rows: int) -> tuple[float, float]:
    """Median CPU microseconds per row: the Spark side, PostgreSQL (0 when unknown)."""
    client = statistics.median(t.client_cpu_s for t in results)
    pg = statistics.median(t.postgres_cpu_s or 0.0 for t in results)
    return client / rows * 1e6, pg / rows * 1e6


def _fmt(value: float | None, spec: str) -> str:
    return "unknown" if value is None else format(value, spec)


@contextmanager
def _session(master: str, partitions: int) -> Iterator[tuple[Any, str]]:
    """A Spark session on local[partitions], or on a fresh two-worker standalone cluster."""
    from spark_outbox.billing.session import build_session

    jars = [str(JAR)] + ([str(_CEILING_JAR)] if _CEILING_JAR.exists() else [])
    conf = {"spark.jars": ",".join(jars), "spark.ui.showConsoleProgress": "false"}
    if master == "local":
        spark = build_session("bench-sink", f"local[{partitions}]", **conf)
        try:
            yield spark, f"local[{partitions}]"
        finally:
            spark.stop()
        return
    from spark_outbox.cli.tools.sparkcluster import StandaloneCluster

    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    cores = max(1, partitions // 2)
    try:
        with StandaloneCluster(work, workers=2, cores=cores, memory="2g") as cluster:
            conf |= {"spark.executor.memory": "1g", "spark.driver.extraClassPath": ":".join(jars)}
            spark = build_session("bench-sink", cluster.master_url, **conf)
            try:
                yield spark, "cluster"
            finally:
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _rows(spark: Any, n: int, partitions: int) -> Any:
    from pyspark.sql import functions as F

    from spark_outbox.spark.keys import effect_key_column

    base = spark.range(0, n, 1, partitions).withColumn("customer", F.concat(F.lit("c"), "id"))
    payload = F.to_json(
        F.struct(
            F.lit("invoice.created").alias("type"),
            F.col("id").alias("invoice"),
            F.col("customer"),
            F.lit("2026-01-01").alias("date"),
            F.lit("EUR").alias("currency"),
            (F.col("id") % 997 * 1.25).cast("decimal(18,4)").cast("string").alias("amount"),
            F.lit("x" * 110).alias("memo"),
        )
    )
    frame = base.select(
        effect_key_column("bench", base.schema, "id").alias("idempotency_key"),
        F.lit("bench-hook").alias("endpoint"),
        F.concat(F.col("customer"), F.lit("@example.test")).alias("recipient"),
        payload.alias("payload"),
    ).persist()
    frame.count()
    return frame


def _time_sink(url: str, rows: Any) -> Timed:
    from spark_outbox.spark.sink import OutboxSink

    _truncate(url)
    sink = OutboxSink(job="bench", database_url=url)
    clock = _Clock()
    outcome = sink.write(None, rows, batch_id=f"run-{uuid.uuid4().hex[:8]}")
    timed = clock.stop("atomic + dedup; the commit transaction open {:.2f} s")
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT duration_s FROM batches WHERE job = 'bench'")
        commit_s = cur.fetchone()[0]
    assert outcome.effects_new == rows.count(), outcome
    return dataclasses.replace(timed, note=timed.note.format(commit_s))


def _time_guarded(url: str, rows: Any) -> Timed:
    from spark_outbox.spark.guard import VolumeGuard

    return _time_with_markers(url, rows, VolumeGuard())


def _time_unguarded(url: str, rows: Any) -> Timed:
    from spark_outbox.spark.guard import VolumeGuard

    return _time_with_markers(url, rows, VolumeGuard.off())


def _time_with_markers(url: str, rows: Any, guard: Any) -> Timed:
    """The sink after 20 earlier markers of the job (a baseline: the guard reads it)."""
    from spark_outbox.spark.sink import OutboxSink

    _truncate(url)
    n = rows.count()
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO batches (job, batch_id, run_id, effects_new, effects_new_by_endpoint, "
            "committed_at) SELECT 'bench', 'earlier-' || i, gen_random_uuid(), %(n)s, "
            "jsonb_build_object('bench-hook', %(n)s), now() - make_interval(hours => i) "
            "FROM generate_series(1, 20) i",
            {"n": n},
        )
    sink = OutboxSink(job="bench", database_url=url, volume_guard=guard)
    clock = _Clock()
    outcome = sink.write(None, rows, batch_id=f"run-{uuid.uuid4().hex[:8]}")
    timed = clock.stop("the commit transaction open {:.2f} s")
    assert outcome.effects_new == n and outcome.held_reason is None, outcome
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT duration_s FROM batches WHERE job = 'bench' AND duration_s IS NOT NULL")
        commit_s = cur.fetchone()[0]
    return dataclasses.replace(timed, note=timed.note.format(commit_s))


def _time_jdbc(url: str, rows: Any) -> Timed:
    from pyspark.sql import functions as F

    _truncate(url)
    frame = rows.select(
        "*",
        F.sha2("payload", 256).alias("payload_sha256"),
        F.lit("bench").alias("job"),
        F.lit("jdbc").alias("batch_id"),
    )
    clock = _Clock()
    (
        frame.write.format("jdbc")
        .option("url", _jdbc_url(url))
        .option("dbtable", "effects")
        .option("batchsize", 10_000)
        .option("driver", "org.postgresql.Driver")
        .mode("append")
        .save()
    )
    return clock.stop("non-atomic: one transaction per partition")


def _time_copy(url: str, rows: Any) -> Timed:
    from pyspark.sql import functions as F

    _truncate(url)
    folder = Path(tempfile.mkdtemp(prefix="bench-sink-"))
    try:
        rows.select("*", F.sha2("payload", 256).alias("sha")).coalesce(1).write.csv(
            str(folder / "csv"), escape='"'
        )
        csv = next((folder / "csv").glob("part-*.csv"))
        clock = _Clock()
        with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur, csv.open() as f:
            cur.copy_expert(
                "COPY effects (idempotency_key, endpoint, recipient, payload, payload_sha256) "
                "FROM STDIN WITH (FORMAT csv)",
                f,
            )
        return clock.stop("one stream, no dedup, no marker")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _time_executor_copy(url: str, rows: Any) -> Timed:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    _truncate(url)
    frame = rows.select("*", F.sha2("payload", 256).alias("payload_sha256"))
    written = T.StructType([T.StructField("rows", T.LongType())])
    clock = _Clock()
    counts = frame.mapInArrow(_copy_partition(_libpq(url)), written).collect()
    timed = clock.stop("parallel, no checks, no dedup, no marker")
    assert sum(r.rows for r in counts) == rows.count(), counts
    return timed


def _time_jvm_copy(url: str, rows: Any) -> Timed:
    from pyspark.sql import functions as F

    _truncate(url)
    columns = ("job", "batch_id", "idempotency_key", "endpoint", "recipient", "payload")
    frame = rows.select(
        F.lit("bench").alias("job"),
        F.lit("jvm").alias("batch_id"),
        "idempotency_key",
        "endpoint",
        "recipient",
        "payload",
        F.sha2("payload", 256).alias("payload_sha256"),
    )
    sql = f"COPY effects ({', '.join(columns)}, payload_sha256) FROM STDIN WITH (FORMAT binary)"
    jvm = rows.sparkSession.sparkContext._jvm
    clock = _Clock()
    jvm.outboxbench.CopyWriter.write(frame._jdf, _jdbc_url(url), sql, columns.index("payload"))
    timed = clock.stop("parallel, in the JVM: no Python, no checks, no dedup, no marker")
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM effects")
        assert cur.fetchone()[0] == rows.count()
    return timed


_CEILING_JAR = Path(tempfile.gettempdir()) / f"outbox-bench-ceiling-{os.getpid()}.jar"


def _build_ceiling() -> bool:
    """Compile bench/jvm/CopyWriter.java into ``_CEILING_JAR``; False without a JDK."""
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        return False
    import pyspark

    spark_jars = Path(pyspark.__file__).parent / "jars"
    source = Path(__file__).parent / "jvm" / "CopyWriter.java"
    with tempfile.TemporaryDirectory() as classes:
        subprocess.run(
            [javac, "-nowarn", "-d", classes, "-cp", f"{spark_jars}/*:{JAR}", str(source)],
            check=True,
        )
        subprocess.run([jar, "cf", str(_CEILING_JAR), "-C", classes, "outboxbench"], check=True)
    return True


def _copy_partition(dsn: str) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function of the ceiling: one binary COPY per Arrow batch,
    one transaction per partition."""

    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from spark_outbox.spark import pgbinary

        columns = ("idempotency_key", "endpoint", "recipient", "payload", "payload_sha256")
        sql = f"COPY effects (job, batch_id, {', '.join(columns)}) FROM STDIN WITH (FORMAT binary)"
        shared = (
            pgbinary.field_count(len(columns) + 2)
            + pgbinary.text("bench")
            + pgbinary.text("ceiling")
        )
        n = 0
        with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
            for batch in batches:
                fields = [
                    pgbinary.jsonb_column(batch.column(name))
                    if name == "payload"
                    else pgbinary.text_column(batch.column(name))
                    for name in columns
                ]
                data = pgbinary.copy_stream(batch.num_rows, shared, fields)
                cur.copy_expert(sql, data.open(), 1 << 20)
                n += batch.num_rows
        conn.close()
        yield pa.RecordBatch.from_pydict({"rows": [n]}, pa.schema([("rows", pa.int64())]))

    return write


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def _ensure_jdbc_jar() -> bool:
    if not JAR.exists() and os.geteuid() == 0 and shutil.which("apt-get"):
        subprocess.run(
            ["apt-get", "install", "-y", "-q", "libpostgresql-jdbc-java"],
            check=False,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    return JAR.exists()


def _libpq(url: str) -> str:
    from spark_outbox.core import db

    return db.libpq_url(url)


def _jdbc_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    u = make_url(url)
    query = f"user={u.username}&reWriteBatchedInserts=true&stringtype=unspecified"
    if u.password:
        query += f"&password={u.password}"
    return f"jdbc:postgresql://{u.host}:{u.port or 5432}/{u.database}?{query}"


def _register_endpoint(url: str) -> None:
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO endpoints (name, kind, url, signing_secret) "
            "VALUES ('bench-hook', 'webhook', 'http://127.0.0.1:9/', 'whsec_YmVuY2g=') "
            "ON CONFLICT (name) DO NOTHING"
        )


def _truncate(url: str) -> None:
    with psycopg2.connect(_libpq(url)) as conn, conn.cursor() as cur:
        cur.execute(
            "TRUNCATE effects, batches, deferred_effects, staged_rejects, staged_results, "
            "batch_runs CASCADE"
        )
    with psycopg2.connect(_checkpointer()) as conn, conn.cursor() as cur:
        cur.execute("CHECKPOINT")


def _checkpointer() -> str:
    """Who may CHECKPOINT: the private cluster's bootstrap superuser (its application
    role may not), or ``DATABASE_URL``'s role, which then needs pg_checkpoint."""
    from spark_outbox.cli.tools.pgcluster import ADMIN_ROLE, PrivateCluster
    from spark_outbox.core.settings import Settings

    settings = Settings.from_env()
    if settings.database_url:
        return _libpq(settings.database_url)
    info = PrivateCluster(settings.state_dir).ensure_running()
    if info.admin_password is None:  # a cluster made before the roles were split
        return _libpq(info.url)
    return f"postgresql://{ADMIN_ROLE}:{info.admin_password}@127.0.0.1:{info.port}/postgres"


def _fresh_database(server: str) -> str:
    from spark_outbox.core import db

    name = f"bench_sink_{uuid.uuid4().hex[:8]}"
    conn = psycopg2.connect(db.libpq_url(server))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    from sqlalchemy.engine import make_url

    url = make_url(db.sqlalchemy_url(server)).set(database=name).render_as_string(False)
    db.upgrade(url)
    return url


def _drop_database(server: str, url: str) -> None:
    from sqlalchemy.engine import make_url

    from spark_outbox.core import db

    conn = psycopg2.connect(db.libpq_url(server))
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    conn.close()
