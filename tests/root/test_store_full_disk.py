"""A real full file system under the aggregator's database (a small tmpfs): the write fails at
COMMIT (WAL pages go out then), the sequence state stays as it was, nothing refused is acked,
and growing the file system is all it takes to recover."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect
from c4.core import wire
from c4.core.wire import Frame


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "c4test", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _event(seq: int) -> bytes:
    return wire.encode(Frame("event", "h1", "b1", seq, 1.0, {
        "type": "port_state", "severity": "warning", "msg": "x" * 2000,
        "attrs": {"dev": "mlx5_0", "port": 1, "from": "ACTIVE", "to": "DOWN"}}))


def test_full_file_system_loses_nothing_and_recovers(small_fs: Path) -> None:
    ing = Ingest(Store(connect(small_fs / "c4.db")), HostRegistry(), None)
    seq = 1
    while ing.handle(_event(seq), 1.0).reject is None:
        seq += 1
        assert seq < 1000, "the file system never filled"
    s = ing.registry.hosts["h1"].seqs["b1"]
    assert s.contiguous == seq - 1 and ing.store.failing is not None
    acked = dict((h, f.body["seq"]) for h, f in ing.take_acks(1.0))
    assert acked == {"h1": seq - 1}
    for _ in range(3):  # the agent resends; still full: not stored, not a duplicate, not acked
        out = ing.handle(_event(seq), 2.0)
        assert out.reject == "store_error" and not out.duplicate
    assert ing.take_acks(2.0) == [] and s.contiguous == seq - 1
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_fs)], check=True)
    out = ing.handle(_event(seq), 3.0)
    assert out.reject is None and ing.store.failing is None
    assert dict((h, f.body["seq"]) for h, f in ing.take_acks(3.0)) == {"h1": seq}
    assert [r[2] for r in ing.store.frames("h1")] == list(range(1, seq + 1))
