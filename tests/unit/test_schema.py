"""The aggregator's SQLite schema and its migrations: a database written by c4 0.1 (captured
in tests/fixtures/db/c4-0.1.sql) opens with today's code, keeps its rows and gets a version;
a newer database is refused; a failed migration changes nothing."""
from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from c4.aggregator.actions import ActionRunner, ActionsConfig
from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.incidents import Incidents
from c4.aggregator.schema import MIGRATIONS, VERSION, SchemaError, migrate
from c4.aggregator.store import Store, connect


def _old_db(fixtures: Path, tmp_path: Path) -> Path:
    path = tmp_path / "c4.db"
    with sqlite3.connect(path) as db:
        db.executescript((fixtures / "db" / "c4-0.1.sql").read_text())
    return path


def test_a_c4_0_1_database_opens_and_keeps_its_rows(fixtures: Path, tmp_path: Path) -> None:
    path = _old_db(fixtures, tmp_path)
    conn = connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (0,)
    Store(conn)
    incidents = Incidents(conn, DiagnosisConfig(), None, logging.getLogger("test"))
    runner = ActionRunner(ActionsConfig(), conn, logging.getLogger("test"))
    assert conn.execute("PRAGMA user_version").fetchone() == (VERSION,)
    assert conn.execute("SELECT contiguous FROM seqs WHERE host = 'gpu-01'").fetchone() == (42,)
    assert [r["outcome"] for r in runner.records(1)] == ["dry-run"]
    assert incidents.mem == {}  # the stored incident is resolved: not loaded into memory
    (cls,) = conn.execute("SELECT class FROM incidents WHERE id = 1").fetchone()
    assert cls == "hw_xid"


def test_every_table_the_code_uses_is_in_the_schema(tmp_path: Path) -> None:
    conn = connect(tmp_path / "new.db")
    migrate(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"hosts", "seqs", "frames", "incidents", "actions"} <= tables


def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    conn = connect(tmp_path / "future.db")
    conn.execute(f"PRAGMA user_version = {VERSION + 1}")
    with pytest.raises(SchemaError, match="newer than this c4 knows"):
        Store(conn)


def test_migrations_apply_in_order_and_a_failed_one_changes_nothing(tmp_path: Path) -> None:
    conn = connect(tmp_path / "m.db")
    migrate(conn)
    later = (*MIGRATIONS, "ALTER TABLE hosts ADD COLUMN rack TEXT;",
             "CREATE TABLE not_yet (id INTEGER PRIMARY KEY); SELECT no_such_function();")
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, later)
    # The good step landed with its version; the failing one left no table behind.
    assert conn.execute("PRAGMA user_version").fetchone() == (VERSION + 1,)
    cols = [r[1] for r in conn.execute("PRAGMA table_info(hosts)")]
    assert "rack" in cols
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'not_yet'").fetchone() is None
