"""Resident memory of a dispatcher draining a large backlog: does it stay flat?

    flock /tmp/outbox-bench.lock .venv/bin/python -m bench backlog -- [--effects 1000000]

Loads N effects (one INSERT ... SELECT, committed before any dispatcher runs),
starts ``outbox dispatcher run --until-idle`` (``--processes`` at its default:
one worker per core under one supervisor) against the bench receiver, and
samples every worker process's RSS (``/proc/PID/status`` VmRSS) once a second
until it exits. Prints the RSS at each tenth of the drain and the peak per
process (aim: <= 200 MB, and flat: the last tenth no higher than the second).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import sqlalchemy as sa

from bench.bench_dispatch import uptime
from bench.contenders import ROOT
from bench.database import bench_database, insert_effects, load
from bench.receiver import serve


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree(pid: int) -> list[int]:
    """``pid`` and its children (the supervisor's workers)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid, *(int(c) for c in children)]


def drain(engine: sa.Engine, url: str, n: int) -> tuple[subprocess.Popen[bytes], dict[int, float]]:
    """Run the dispatcher until idle; print the largest worker's RSS at each tenth."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env |= {"DATABASE_URL": url, "OUTBOX_SSRF_ALLOW_NETWORKS": "127.0.0.0/8"}
    env |= {"OUTBOX_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "spark_outbox", "dispatcher", "run", "--until-idle"],
        cwd=ROOT,
        env=env,
    )
    peak: dict[int, float] = {}
    last_tenth = -1
    while proc.poll() is None:
        time.sleep(1.0)
        pids = tree(proc.pid)
        for pid in pids:
            peak[pid] = max(peak.get(pid, 0.0), rss_mb(pid))
        with engine.connect() as conn:
            done = conn.execute(
                sa.text("SELECT count(*) FROM effects WHERE state = 'delivered'")
            ).scalar_one()
        tenth = int(10 * done / n)
        if tenth > last_tenth and proc.poll() is None and len(pids) > 1:
            last_tenth = tenth
            worst = max((rss_mb(pid) for pid in pids[1:] or pids), default=0.0)
            print(f"  {done:>9,} delivered: largest worker RSS {worst:6.1f} MB", flush=True)
    return proc, peak


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="bench backlog")
    p.add_argument("--effects", type=int, default=1_000_000)
    n = p.parse_args(argv).effects
    print(f"start {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}", flush=True)
    with serve() as (base, _), bench_database() as url:
        engine = load(url, base)
        t0 = time.perf_counter()
        insert_effects(engine, n)
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE effects"))
        print(f"loaded {n:,} effects in {time.perf_counter() - t0:.0f} s", flush=True)
        start = time.perf_counter()
        proc, peak = drain(engine, url, n)
        elapsed = time.perf_counter() - start
        engine.dispose()
    print(f"exit code {proc.returncode}; {n:,} drained in {elapsed:.0f} s ({n / elapsed:,.0f}/s)")
    print("peak RSS per process (MB): " + ", ".join(f"{v:.1f}" for v in peak.values()))
    print(f"end {time.strftime('%Y-%m-%d %H:%M')}: {uptime()}")
    return 0 if proc.returncode == 0 else 1
