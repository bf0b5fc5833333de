"""SQLite persistence (stdlib sqlite3, WAL): hosts, per-boot sequence state, stored frames.

Acks are sent only after the frames they cover are committed, so a crash between receive and
commit makes the agent resend rather than lose anything.
"""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any, Iterable

from .schema import migrate

class StoreError(OSError):
    """The database cannot be opened for writing at start (read-only file or file system, no
    space for a new one): the aggregator refuses to start with this message."""


def connect(path: str | Path, check_same_thread: bool = True) -> sqlite3.Connection:
    if str(path) != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = sqlite3.connect(str(path), isolation_level=None,
                               check_same_thread=check_same_thread)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        # A write lock taken and given back: a database we could only read would otherwise
        # fail at the first frame, long after start.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the database {path} for writing: {exc}") from None
    return conn


class Store:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        # Set while writes fail (full disk, read-only, I/O error): (error, since). Frames are
        # not acked meanwhile; reads go on; /healthz says so. Cleared by the next commit.
        self.failing: tuple[str, float] | None = None
        migrate(conn)
        # Bytes of raw frame data stored (retention by bytes); blob lengths come from the
        # row headers, the data is not read.
        (self.frame_bytes,) = conn.execute(
            "SELECT coalesce(sum(length(data)), 0) FROM frames").fetchone()
        self._uncommitted_bytes = 0

    def begin(self) -> None:
        self.conn.execute("BEGIN")

    def commit(self) -> None:
        self.conn.execute("COMMIT")
        self.frame_bytes += self._uncommitted_bytes
        self._uncommitted_bytes = 0

    def rollback(self) -> None:
        self._uncommitted_bytes = 0
        if self.conn.in_transaction:
            self.conn.execute("ROLLBACK")

    def insert_frames(self, rows: list[tuple[str, str, int, str, float, float, bytes]]) -> None:
        """(host, boot, seq, kind, ts, received, data) rows; one already stored is left as is."""
        self.conn.executemany("INSERT OR IGNORE INTO frames VALUES (?,?,?,?,?,?,?)", rows)
        self._uncommitted_bytes += sum(len(r[6]) for r in rows)

    def stored_seqs_above(self, host: str, boot: str, seq: int) -> list[int]:
        rows = self.conn.execute(
            "SELECT seq FROM frames WHERE host=? AND boot=? AND seq>? ORDER BY seq",
            (host, boot, seq))
        return [r[0] for r in rows]

    def save_seqs(self, rows: list[tuple[str, str, int, int]]) -> None:
        """(host, boot, contiguous, lost) rows."""
        self.conn.executemany(
            "INSERT INTO seqs VALUES (?,?,?,?) ON CONFLICT(host, boot) DO UPDATE SET "
            "contiguous=excluded.contiguous, lost=excluded.lost", rows)

    def load_seq(self, host: str, boot: str) -> tuple[int, int]:
        row = self.conn.execute("SELECT contiguous, lost FROM seqs WHERE host=? AND boot=?",
                                (host, boot)).fetchone()
        return (row[0], row[1]) if row else (0, 0)

    def save_host(self, name: str, boot: str, hello: dict[str, Any], first_seen: float,
                  last_seen: float) -> None:
        self.conn.execute(
            "INSERT INTO hosts VALUES (?,?,?,?,?) ON CONFLICT(name) DO UPDATE SET "
            "boot=excluded.boot, hello=excluded.hello, last_seen=excluded.last_seen",
            (name, boot, json.dumps(hello, sort_keys=True), first_seen, last_seen))

    def forget_host(self, name: str) -> None:
        self.conn.execute("DELETE FROM hosts WHERE name=?", (name,))
        self.conn.execute("DELETE FROM seqs WHERE host=?", (name,))

    def hosts(self) -> Iterable[tuple[str, str, dict[str, Any], float, float]]:
        for name, boot, hello, first, last in self.conn.execute(
                "SELECT name, boot, hello, first_seen, last_seen FROM hosts ORDER BY name"):
            yield name, boot, json.loads(hello), first, last

    def frames(self, host: str | None = None) -> list[tuple[str, str, int, str]]:
        q = "SELECT host, boot, seq, kind FROM frames"
        args: tuple[str, ...] = ()
        if host is not None:
            q += " WHERE host=?"
            args = (host,)
        return list(self.conn.execute(q + " ORDER BY host, boot, seq", args))

    def prune(self, older_than: float) -> int:
        return self._delete_received("<", older_than)

    def prune_bytes(self, max_bytes: int) -> int:
        """Delete the oldest frames (by receive time) until at most max_bytes are kept."""
        excess = self.frame_bytes - max_bytes
        if excess <= 0:
            return 0
        freed, cutoff = 0, None
        cur = self.conn.execute("SELECT received, length(data) FROM frames ORDER BY received")
        for received, n in cur:
            freed, cutoff = freed + n, received
            if freed >= excess:
                break
        cur.close()
        return 0 if cutoff is None else self._delete_received("<=", cutoff)

    def _delete_received(self, op: str, t: float) -> int:
        with self.conn:  # one transaction: the byte count follows only what was deleted
            (freed,) = self.conn.execute(
                f"SELECT coalesce(sum(length(data)), 0) FROM frames WHERE received {op} ?",
                (t,)).fetchone()
            n = self.conn.execute(f"DELETE FROM frames WHERE received {op} ?", (t,)).rowcount
        self.frame_bytes -= freed
        return n
