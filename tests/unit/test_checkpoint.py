"""WAL checkpoints run on their own thread (issue 15): the ingest connection's commits leave the
WAL to it, and it copies everything back without blocking them."""
from __future__ import annotations

import os
from pathlib import Path

from c4.aggregator.checkpoint import FALLBACK_PAGES, Checkpointer
from c4.aggregator.store import Store, connect
from tests.e2e.procs import wait_for


def test_commits_leave_checkpoints_to_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "c4.db"
    store = Store(connect(path))
    # a thread that does not run during the commits (at 0.05 s it did, on a loaded machine)
    idle = Checkpointer(str(path), store.conn, interval=3600)
    try:
        assert store.conn.execute("PRAGMA wal_autocheckpoint").fetchone() == (FALLBACK_PAGES,)
        for i in range(200):  # ~2 MB: past SQLite's default 1,000-page autocheckpoint
            store.begin()
            store.insert_frames([("h", "b", i, "report", 1.0, 1.0, os.urandom(10000))])
            store.commit()
        assert path.stat().st_size < 1 << 20  # the commits did not checkpoint: all in the WAL
    finally:
        idle.close()
    ck = Checkpointer(str(path), store.conn, interval=0.05)
    try:
        wait_for(lambda: path.stat().st_size > 2_000_000, 10, "the WAL copied into the database")
    finally:
        ck.close()
    assert not ck._thread.is_alive() and ck.errors == 0 and idle.errors == 0
