"""SQLite WAL checkpoints off the ingest thread.

In WAL mode with synchronous=NORMAL a commit does not fsync, but a checkpoint (copying the WAL
back into the database) fsyncs both files, and SQLite runs one inside whichever commit crosses
`wal_autocheckpoint` pages: the ingest thread, under the global lock. At a few MB of frames per
second that is a wait every fraction of a second (bench/ingest.py: 340 µs of wall time per
frame for 178 µs of CPU on the development VM). Here a thread with its own connection runs
PASSIVE checkpoints, which never block the writer, once a second; the ingest connection
checkpoints itself only if that thread falls FALLBACK_PAGES behind (back-pressure instead of an
unbounded WAL). Durability is unchanged: commits are in the WAL either way.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
import time

FALLBACK_PAGES = 65536  # 256 MiB of 4 KiB pages


class Checkpointer:
    def __init__(self, path: str, conn: sqlite3.Connection, interval: float = 1.0,
                 log: logging.Logger | None = None) -> None:
        self.path, self.interval = path, interval
        self.log = log or logging.getLogger("c4.aggregator.checkpoint")
        self.errors = 0
        conn.execute(f"PRAGMA wal_autocheckpoint={FALLBACK_PAGES}")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="c4-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=1000")
        last_log = -1e18
        try:
            while not self._stop.wait(self.interval):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                except sqlite3.Error as exc:  # full disk, I/O error: the next second tries again
                    self.errors += 1
                    if time.monotonic() - last_log >= 60:
                        last_log = time.monotonic()
                        self.log.warning("WAL checkpoint failed (%s); retrying every %.0f s",
                                         exc, self.interval)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
