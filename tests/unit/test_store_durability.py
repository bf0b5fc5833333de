"""A store that cannot write (issue 10): nothing is acked that is not committed, sequence state
changes only after a commit, reads go on, /healthz says so, and it all recovers by itself.

SQLite's own "database or disk is full" comes from `PRAGMA max_page_count`; a real full file
system (a failing COMMIT) is in tests/root/test_store_full_disk.py.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry, SeqState
from c4.aggregator.store import Store, connect
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import wait_for
from tests.unit.test_server_survives import _acked, _agent, _api

UNLIMITED = 1073741823


def _event(seq: int, floor: int | None = None) -> bytes:
    return wire.encode(Frame("event", "h1", "b1", seq, 1.0, {
        "type": "port_state", "severity": "warning", "msg": "x" * 2000,
        "attrs": {"dev": "mlx5_0", "port": 1, "from": "ACTIVE", "to": "DOWN"}}, floor=floor))


def _fill(conn) -> None:
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count={pages}")  # SQLite's real "disk is full"


def test_settle_and_add() -> None:
    s = SeqState(contiguous=3, above={5, 6, 9})
    s.settle_below(6)
    s.add(7)
    assert (s.contiguous, s.lost, s.above) == (7, 1, {9})


def test_a_failed_write_changes_no_sequence_state(tmp_path: Path) -> None:
    ing = Ingest(Store(connect(tmp_path / "c4.db")), HostRegistry(), None)
    ing.handle(_event(1), 1.0)
    ing.handle(_event(3), 1.0)
    ing.take_acks(1.0)
    _fill(ing.store.conn)
    seq = 4
    while ing.handle(_event(seq), 2.0).reject is None:
        seq += 1
        assert seq < 100
    s = ing.registry.hosts["h1"].seqs["b1"]
    before = (s.contiguous, s.lost, set(s.above))
    # The agent dropped 2 (floor 3) and sends the next frame: the write fails, so neither the
    # settled gap nor the frame may count as done.
    assert ing.handle(_event(seq + 1, floor=3), 2.5).reject == "store_error"
    assert (s.contiguous, s.lost, set(s.above)) == before
    assert ing.take_acks(2.5) == []
    # Its resend is not a duplicate: it is stored once the database can be written again.
    ing.store.conn.execute(f"PRAGMA max_page_count={UNLIMITED}")
    assert ing.store.failing is not None
    for n in range(seq, seq + 2):
        out = ing.handle(_event(n, floor=3), 3.0)
        assert out.reject is None and not out.duplicate
    assert ing.store.failing is None
    assert [r[2] for r in ing.store.frames("h1")] == [1, 3] + list(range(4, seq + 2))
    assert s.lost == 1 and s.contiguous == seq + 1


def test_full_store_stops_acks_serves_reads_and_recovers(server) -> None:  # noqa: F811
    sock = _agent(server)
    try:
        sock.send(_event(1))
        wait_for(lambda: _acked(sock, 1), 10, "first ack")
        with server.lock:
            _fill(server.core.store.conn)
        for seq in range(2, 41):
            sock.send(_event(seq))
        wait_for(lambda: server.core.store.failing is not None, 10, "the store to fill")
        code, health = _api(server, "/healthz")
        assert code == 503 and not health["ok"] and not health["store"]["writable"]
        assert "full" in health["store"]["error"]
        assert _api(server, "/api/v1/hosts")[0] == 200  # reads go on
        highest = 1  # acked above; an ack never covers a frame that was refused
        while sock.poll(300):
            f = wire.decode(sock.recv())
            if f.kind == "ack":
                highest = max(highest, f.body["seq"])
        with server.lock:
            stored = [r[2] for r in server.core.store.frames("h1")]
            server.core.store.conn.execute(f"PRAGMA max_page_count={UNLIMITED}")
        assert highest == max(stored) < 40
        for seq in range(highest + 1, 41):  # the agent's resend
            sock.send(_event(seq))
        wait_for(lambda: _acked(sock, 40), 10, "ack after recovery")
        code, health = _api(server, "/healthz")
        assert code == 200 and health["store"]["writable"]
    finally:
        sock.close(0)


def test_a_read_only_database_at_start_is_a_clear_error() -> None:
    """Root writes through file modes, so the aggregator runs as `nobody` where we are root."""
    as_user: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("needs setpriv to drop root")
        as_user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    d = Path(tempfile.mkdtemp(prefix="c4-ro-"))
    try:
        os.chmod(d, 0o755)
        db = d / "c4.db"
        connect(db).close()
        os.chmod(db, 0o444)
        if not as_user:
            os.chmod(d, 0o555)
        cfg = d / "aggregator.toml"
        cfg.write_text(f'db = "{db}"\ninsecure = true\nlisten = "tcp://127.0.0.1:0"\n'
                       f'api = "127.0.0.1:0"\n')
        os.chmod(cfg, 0o644)
        repo = Path(__file__).resolve().parents[2]
        out = subprocess.run(as_user + [sys.executable, "-m", "c4.cli", "aggregator", "run",
                                        "--config", str(cfg)],
                             capture_output=True, text=True, timeout=60, cwd=repo,
                             env={**os.environ, "PYTHONPATH": str(repo)})
        assert out.returncode != 0
        assert "Traceback" not in out.stderr, out.stderr
        assert "cannot open the database" in out.stderr and "readonly" in out.stderr, out.stderr
    finally:
        os.chmod(d, 0o755)
        shutil.rmtree(d)
