"""The aggregator's SQLite schema, the one definition, versioned with `PRAGMA user_version`.

MIGRATIONS[i] takes a database from version i to i + 1, in one transaction with the version
bump. Version 1 is the schema of c4 0.1, which set no version: its statements are written
`IF NOT EXISTS`, so a 0.1 database (tables present, user_version 0) is adopted as it is. Append
a migration for every change (never edit a released one); tests/unit/test_schema.py opens a
database that 0.1 wrote. A database from a newer c4 is refused rather than misread.
"""
from __future__ import annotations

import sqlite3
from typing import Sequence

MIGRATIONS: tuple[str, ...] = (
    # 1: hosts and per-boot sequence state (store.py), stored frames for replay, incidents
    # (diagnosis/incidents.py), action records (actions.py).
    """
    CREATE TABLE IF NOT EXISTS hosts (
        name TEXT PRIMARY KEY, boot TEXT NOT NULL, hello TEXT NOT NULL,
        first_seen REAL NOT NULL, last_seen REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS seqs (
        host TEXT NOT NULL, boot TEXT NOT NULL, contiguous INTEGER NOT NULL,
        lost INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (host, boot)
    );
    CREATE TABLE IF NOT EXISTS frames (
        host TEXT NOT NULL, boot TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL,
        ts REAL NOT NULL, received REAL NOT NULL, data BLOB NOT NULL,
        PRIMARY KEY (host, boot, seq)
    );
    CREATE INDEX IF NOT EXISTS frames_received ON frames (received);
    CREATE TABLE IF NOT EXISTS incidents (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        class TEXT NOT NULL, state TEXT NOT NULL, job TEXT, comm TEXT, summary TEXT NOT NULL,
        suspects TEXT NOT NULL, evidence TEXT NOT NULL, matrix TEXT,
        first_symptom REAL NOT NULL, detected REAL NOT NULL, localised REAL, resolved REAL,
        updated REAL NOT NULL, actions TEXT NOT NULL, keys TEXT NOT NULL,
        last_active REAL NOT NULL, hold_s REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS incidents_state ON incidents (state);
    CREATE TABLE IF NOT EXISTS actions (
        id INTEGER PRIMARY KEY,
        incident INTEGER NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL,
        backend TEXT NOT NULL, command TEXT NOT NULL, dry_run INTEGER NOT NULL,
        outcome TEXT NOT NULL, detail TEXT NOT NULL, exit_code INTEGER, stderr TEXT NOT NULL,
        duration_s REAL NOT NULL, ts REAL NOT NULL,
        UNIQUE (incident, action, target)
    );
    """,
    # 2: C4P plans pushed to the agents and what each assignment did (planner/service.py).
    """
    CREATE TABLE plans (
        id TEXT PRIMARY KEY, created REAL NOT NULL, reason TEXT NOT NULL,
        epoch INTEGER NOT NULL, max_before REAL, max_after REAL, body TEXT NOT NULL,
        results TEXT NOT NULL
    );
    """,
)
VERSION = len(MIGRATIONS)


class SchemaError(RuntimeError):
    """The database cannot be used by this version of c4 (the message says why)."""


def migrate(conn: sqlite3.Connection, migrations: Sequence[str] = MIGRATIONS) -> int:
    """Bring the database to the latest version; returns the version it was at."""
    (found,) = conn.execute("PRAGMA user_version").fetchone()
    if found > len(migrations):
        raise SchemaError(f"database schema version {found} is newer than this c4 knows "
                          f"({len(migrations)}): upgrade c4, or point it at another database")
    if found < len(migrations) and conn.in_transaction:
        conn.commit()  # a connection in the sqlite3 module's implicit transaction mode
    for version in range(found, len(migrations)):
        # executescript would COMMIT first; run the statements inside our own transaction so
        # the schema change and its version bump land together or not at all.
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _statements(migrations[version]):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return int(found)


def _statements(script: str) -> list[str]:
    out, buf = [], ""
    for piece in script.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):  # not a ';' inside a string literal
            if buf.strip(" \n;"):
                out.append(buf.strip())
            buf = ""
    buf = buf[:-1]  # the ';' added after the last piece
    if buf.strip():
        raise ValueError(f"incomplete SQL statement in migration: {buf.strip()[:80]}")
    return out
