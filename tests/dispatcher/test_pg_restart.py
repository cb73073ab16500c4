"""PostgreSQL restarted mid-drain: the worker rides it out and loses nothing.

Runs on its OWN private cluster (never the shared one the other tests use).
"""

from __future__ import annotations

import collections
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db
from spark_outbox.core.endpoints import add_webhook
from tests.dispatcher import procs
from tests.dispatcher.conftest import Receiver, Reply
from tests.invariants import assert_invariants

pytestmark = pytest.mark.slow


@pytest.fixture
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateCluster]:
    cluster = PrivateCluster(tmp_path_factory.mktemp("pg-restart") / "state")
    yield cluster
    cluster.stop()
    subprocess.run(["rm", "-rf", str(cluster.state_dir)], check=False)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgres_restart_mid_drain_loses_nothing(
    own_cluster: PrivateCluster, receiver: Receiver, tmp_path: Path, mode: str
) -> None:
    """``fast``: a clean restart; ``immediate``: a crash (no checkpoint, every open
    transaction lost), then crash recovery."""
    url = own_cluster.ensure_running().url
    db.upgrade(url)
    engine = db.create_engine(url)
    try:
        with engine.begin() as conn:
            add_webhook(conn, name="hook", url=receiver.url())
        receiver.script("/hook", Reply(200, delay_s=0.01))
        keys = procs.enqueue_many(engine, 1500)
        log = tmp_path / "worker.log"
        worker = procs.start(
            procs.worker_env(url, OUTBOX_WORKER_ID="w", OUTBOX_LOG_LEVEL="INFO"),
            "--until-idle",
            "--concurrency",
            "8",
            "--claim-batch-size",
            "20",
            log=log,
        )
        procs.wait_for(lambda: len(receiver.seen()) >= 200, 30, "the drain to start")
        # pg_ctl restart: same port and options (PrivateCluster.ensure_running would
        # move to a new port while the old one has connections in TIME_WAIT).
        info = own_cluster.ensure_running()
        pg_ctl = [str(info.bin_dir / "pg_ctl"), "-D", str(own_cluster.data_dir)]
        own_cluster._run([*pg_ctl, "-l", str(own_cluster.log_file), "-m", mode, "-w", "restart"])
        seen_during_outage = len(receiver.seen())
        assert worker.wait(90) == 0, log.read_text()[-3000:]
        assert seen_during_outage < 1500  # the restart really was mid-drain
        assert "db.retry" in log.read_text()  # and the worker did see the outage
        engine.dispose()  # pooled connections died with the old server
        seen = collections.Counter(receiver.keys())
        assert set(seen) == set(keys)
        with engine.connect() as conn:
            states = dict(
                conn.execute(sa.text("SELECT state, count(*) FROM effects GROUP BY 1")).all()
            )
            attempted = conn.execute(
                sa.text(
                    "SELECT count(DISTINCT effect_id) FROM delivery_attempts"
                    " WHERE outcome = 'delivered'"
                )
            ).scalar()
        assert states == {"delivered": 1500} and attempted == 1500
        # Resends can only come from sends whose outcome the outage kept from being recorded.
        assert sum(seen.values()) - 1500 <= 8 + 20
    finally:
        engine.dispose()
    assert_invariants(engine)
