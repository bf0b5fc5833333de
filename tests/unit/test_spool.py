"""At-least-once across agent restarts (issue 10): the sender's unacked frames live in a
bounded on-disk spool; a restarted agent resends them under their own boot, and the byte
budget drops the oldest, counted. Real ZeroMQ and the real ingest (tests/unit/test_sender.py)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Iterator

import pytest
import zmq

from c4.agent.sender import Sender
from c4.agent.spool import COMPACT_MIN, REC, Spool
from tests.e2e.procs import free_port
from tests.unit.test_sender import Router, _report


class Link:
    """One agent's spool dir and endpoint, and the aggregator (Router) once a test brings it
    up; every sender and the router are closed after the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.ctx = zmq.Context()
        self.ep = f"tcp://127.0.0.1:{free_port()}"
        self.spool = tmp_path / "spool"
        self.opened: list[Sender] = []
        self._router: Router | None = None

    def sender(self, **kw: Any) -> Sender:
        s = Sender(self.ep, "h1", ctx=self.ctx, spool_dir=self.spool, **kw)
        self.opened.append(s)
        return s

    def router(self) -> Router:
        self._router = Router(self.ctx, self.ep)
        return self._router

    def close(self) -> None:
        for s in self.opened:
            s.close()
        if self._router is not None:
            self._router.sock.close(0)
        self.ctx.term()


@pytest.fixture
def link(tmp_path: Path) -> Iterator[Link]:
    lk = Link(tmp_path)
    try:
        yield lk
    finally:
        lk.close()


def _pump(router: Router, s: Sender, rounds: int = 200) -> None:
    for _ in range(rounds):
        router.pump()
        s.poll(0.02)
        if not s.unacked:
            return


def test_a_restarted_agent_resends_what_its_last_run_did_not_deliver(tmp_path: Path) -> None:
    ctx = zmq.Context()
    ep = f"tcp://127.0.0.1:{free_port()}"  # nothing listens yet: the aggregator is away
    spool = tmp_path / "spool"
    router = None
    try:
        first = Sender(ep, "h1", ctx=ctx, spool_dir=spool)  # aggregator away
        for _ in range(5):
            first.send("report", _report())
        old_boot = first.boot
        first.close()  # the agent stops (or is killed: the spool was written as it went)
        router = Router(ctx, ep)
        second = Sender(ep, "h1", ctx=ctx, spool_dir=spool)
        assert second.unacked == 5
        second.send("report", _report())
        _pump(router, second)
        assert second.unacked == 0
        stored = {(r[1], r[2]) for r in router.ingest.store.frames("h1")}
        assert stored == {(old_boot, n) for n in range(1, 6)} | {(second.boot, 1)}
        second.close()
        third = Sender(ep, "h1", ctx=ctx, spool_dir=spool)
        assert third.unacked == 0
        assert list(spool.iterdir()) == []  # settled files are deleted
        third.close()
    finally:
        if router is not None:
            router.sock.close(0)
        ctx.term()


def test_the_byte_budget_drops_oldest_and_the_floor_settles_them(link: Link) -> None:
    first = link.sender(queue_bytes=2000)
    for _ in range(40):
        first.send("report", _report())
    held = first.unacked
    assert 0 < held < 40 and first.stats.dropped_queue_full == 40 - held
    first.close()
    router = link.router()  # the aggregator comes back
    second = link.sender()
    assert second.unacked == held  # the drops were settled in the spool too
    _pump(router, second)
    assert second.unacked == 0
    seqs = router.ingest.registry.hosts["h1"].seqs[first.boot]
    assert seqs.contiguous == 40 and seqs.lost == 40 - held


def test_resumed_frames_the_budget_drops_are_settled_by_the_floor(link: Link) -> None:
    """The byte budget of a restarted agent drops the oldest of an earlier run's frames: what
    it still resends of that run carries a floor above them, so the aggregator counts them lost
    and acks the rest (with the floor read from the spool, the ack never got past the gap)."""
    first = link.sender()
    for _ in range(10):
        first.send("report", _report())
    first.close()
    frame_bytes = (link.spool / f"{first.boot}.spool").stat().st_size // 10
    second = link.sender(queue_bytes=8 * frame_bytes)
    for _ in range(3):
        second.send("report", _report())  # still away: the oldest resumed frames go
    dropped = second.stats.dropped_queue_full
    assert 0 < dropped < 10
    router = link.router()
    _pump(router, second)
    assert second.unacked == 0
    seqs = router.ingest.registry.hosts["h1"].seqs[first.boot]
    assert seqs.contiguous == 10 and seqs.lost == dropped


def test_an_unreadable_oldest_spooled_frame_is_below_the_floor(link: Link) -> None:
    """A spooled frame that no longer decodes is dropped on resume; the floor the others carry
    is the oldest one actually resent, so the aggregator counts the unreadable one lost instead
    of waiting for it (and never acking the rest)."""
    first = link.sender()
    for _ in range(5):
        first.send("report", _report())
    first.close()
    path = link.spool / f"{first.boot}.spool"
    raw = bytearray(path.read_bytes())
    n = REC.unpack_from(raw, 0)[2]
    raw[REC.size:REC.size + n] = b"\xc1" * n  # never valid msgpack
    path.write_bytes(bytes(raw))
    second = link.sender()
    assert second.unacked == 4
    router = link.router()
    _pump(router, second)
    assert second.unacked == 0
    seqs = router.ingest.registry.hosts["h1"].seqs[first.boot]
    assert seqs.contiguous == 5 and seqs.lost == 1


def test_a_torn_last_record_ends_the_replay(tmp_path: Path) -> None:
    log = logging.getLogger("test")
    sp = Spool(tmp_path, "old", log)
    sp.append("old", 1, b"one")
    sp.append("old", 2, b"two")
    sp.close()
    path = tmp_path / "old.spool"
    path.write_bytes(path.read_bytes()[:-2])  # killed in the middle of a write
    assert Spool(tmp_path, "new", log).load() == {"old": [(1, b"one")]}


def test_a_mostly_settled_file_is_rewritten_with_what_is_live(tmp_path: Path) -> None:
    log = logging.getLogger("test")
    sp = Spool(tmp_path, "old", log)
    chunk = bytes(64 << 10)
    frames = [(seq, chunk) for seq in range(1, 21)]  # 1.25 MiB: past COMPACT_MIN
    for seq, data in frames:
        sp.append("old", seq, data)
    path = tmp_path / "old.spool"
    assert path.stat().st_size > COMPACT_MIN
    sp.settle("old", 18, lambda: frames[18:])
    assert path.stat().st_size < 3 * len(chunk)  # two live frames left, the rest rewritten away
    sp.append("old", 21, b"after")  # appends go on in the rewritten file
    sp.close()
    assert Spool(tmp_path, "new", log).load() == {"old": frames[18:] + [(21, b"after")]}


def test_an_unwritable_spool_falls_back_to_memory(tmp_path: Path) -> None:
    ctx = zmq.Context()
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    try:
        s = Sender("inproc://agg3", "h1", ctx=ctx, spool_dir=blocker / "spool")
        assert s.spool is None
        assert s.send("report", _report()) == 1 and s.unacked == 1
        s.close()
    finally:
        ctx.term()


def test_a_run_whose_spooled_frames_are_all_unreadable_is_deleted(tmp_path: Path) -> None:
    """Nothing of that run can be resent: its file goes, instead of being read (and warned
    about) again at every later start."""
    ctx = zmq.Context()
    spool = tmp_path / "spool"
    try:
        first = Sender("inproc://agg-unreadable", "h1", ctx=ctx, spool_dir=spool)
        for _ in range(2):
            first.send("report", _report())
        first.close()
        path = spool / f"{first.boot}.spool"
        raw = bytearray(path.read_bytes())
        off = 0
        while off < len(raw):
            n = REC.unpack_from(raw, off)[2]
            raw[off + REC.size:off + REC.size + n] = b"\xc1" * n  # never valid msgpack
            off += REC.size + n
        path.write_bytes(bytes(raw))
        second = Sender("inproc://agg-unreadable", "h1", ctx=ctx, spool_dir=spool)
        try:
            assert second.unacked == 0
            assert not path.exists()
        finally:
            second.close()
    finally:
        ctx.term()


def test_a_rewrite_cut_short_by_a_crash_is_removed_at_start(tmp_path: Path) -> None:
    """os.replace never happened, so the .spool still holds everything; the half-written
    .tmp is garbage that nothing else would ever delete."""
    log = logging.getLogger("test")
    sp = Spool(tmp_path, "old", log)
    sp.append("old", 1, b"one")
    sp.close()
    (tmp_path / "old.tmp").write_bytes(b"half a rewr")
    assert Spool(tmp_path, "new", log).load() == {"old": [(1, b"one")]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.spool"]
