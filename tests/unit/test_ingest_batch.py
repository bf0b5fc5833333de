"""Ingest in batches (issue 15): one transaction per drain, acks and diagnosis only after its
commit, a failed commit undoes the whole batch's sequence state; raw frames bounded by bytes."""
from __future__ import annotations

from pathlib import Path

from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect
from c4.core import wire
from c4.core.wire import Frame

UNLIMITED = 1073741823


def _report(host: str, seq: int, floor: int | None = None, pad: int = 0) -> bytes:
    body = {"interval": 1.0, "health": {f"c{i}": {"ok": True, "reason": "x" * 500}
                                        for i in range(pad // 500)}}
    return wire.encode(Frame("report", host, "b1", seq, 1.0, body, floor=floor))


class Seen:
    def __init__(self) -> None:
        self.frames: list[tuple[str, int]] = []

    def observe(self, frame: Frame, now: float) -> None:
        self.frames.append((frame.host, frame.seq))

    def tick(self, now: float) -> None: ...
    def host_silent(self, host: str, last_seen: float, now: float) -> None: ...
    def host_back(self, host: str, now: float) -> None: ...


def _ingest(path: Path | str, **kw) -> tuple[Ingest, Seen, list[str]]:
    seen = Seen()
    store = Store(connect(path))
    commits: list[str] = []
    store.conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
    return Ingest(store, HostRegistry(), seen, **kw), seen, commits


def _acks(ing: Ingest) -> dict[str, int]:
    return {host: f.body["seq"] for host, f in ing.take_acks(2.0)}


def test_one_commit_per_batch_and_nothing_acked_or_observed_before_it(tmp_path: Path) -> None:
    ing, seen, commits = _ingest(tmp_path / "c4.db")
    with ing.batch():
        for seq in (1, 2, 3):
            for host in ("h1", "h2"):
                assert ing.handle(_report(host, seq), 1.0).reject is None
        assert ing.handle(_report("h1", 2), 1.0).duplicate  # a resend of a staged frame
        assert ing.store.frames() == [] and seen.frames == [] and commits == []
        assert _acks(ing) == {"h1": 3, "h2": 3}  # take_acks commits first
        assert len(commits) == 1
    assert len(ing.store.frames()) == 6
    assert seen.frames == [(h, s) for s in (1, 2, 3) for h in ("h1", "h2")]  # arrival order
    assert ing.accepted["report"] == 6 and ing.duplicates == 1


def test_outside_a_batch_each_frame_commits_alone(tmp_path: Path) -> None:
    ing, seen, commits = _ingest(tmp_path / "c4.db")
    ing.handle(_report("h1", 1), 1.0)
    assert len(commits) == 1 and seen.frames == [("h1", 1)]
    assert _acks(ing) == {"h1": 1}


def test_a_failed_commit_undoes_the_whole_batch(tmp_path: Path) -> None:
    ing, seen, _ = _ingest(tmp_path / "c4.db")
    ing.handle(_report("h1", 1), 1.0)
    ing.handle(_report("h2", 1), 1.0)
    assert _acks(ing) == {"h1": 1, "h2": 1}
    pages = ing.store.conn.execute("PRAGMA page_count").fetchone()[0]
    ing.store.conn.execute(f"PRAGMA max_page_count={pages}")  # SQLite's real "disk is full"
    s1 = ing.registry.hosts["h1"].seqs["b1"]
    with ing.batch():
        outs = [ing.handle(_report("h1", seq, floor=3, pad=3000), 2.0) for seq in (3, 4)]
        outs.append(ing.handle(_report("h2", 2, pad=3000), 2.0))
        assert ing.handle(_report("h1", 3), 2.0).duplicate  # staged, not stored
        assert s1.contiguous == 4  # in memory only
        assert _acks(ing) == {"h1": 1}  # the commit fails: acks go no further than before
    assert [o.reject for o in outs] == ["store_error"] * 3
    assert (s1.contiguous, s1.lost, s1.above) == (1, 0, set())  # as before the batch
    assert ing.store.failing is not None and ing.store_errors == 3
    assert seen.frames == [("h1", 1), ("h2", 1)]
    ing.store.conn.execute(f"PRAGMA max_page_count={UNLIMITED}")
    with ing.batch():  # the resends are new frames, not duplicates
        for seq in (3, 4):
            out = ing.handle(_report("h1", seq, floor=3), 3.0)
            assert out.reject is None and not out.duplicate
    assert _acks(ing) == {"h1": 4}
    assert (s1.contiguous, s1.lost) == (4, 1)
    assert ing.store.failing is None


def test_raw_frames_are_bounded_by_bytes_oldest_first(tmp_path: Path) -> None:
    frame = len(_report("h1", 1, pad=4000))
    ing, _, _ = _ingest(tmp_path / "c4.db", retention_bytes=20 * frame)
    for seq in range(1, 101):
        with ing.batch():
            ing.handle(_report("h1", seq, pad=4000), float(seq))
    (stored,) = ing.store.conn.execute("SELECT sum(length(data)) FROM frames").fetchone()
    assert stored == ing.store.frame_bytes <= 20 * frame * 1.01
    seqs = [r[2] for r in ing.store.frames()]
    assert seqs[-1] == 100 and seqs == list(range(seqs[0], 101)) and len(seqs) >= 18
    # Age pruning keeps the count right too, and a reopened store counts what is there.
    ing.prune(95.5 + ing.retention_s)
    assert [r[2] for r in ing.store.frames()] == list(range(96, 101))
    ing.store.conn.close()
    again = Store(connect(tmp_path / "c4.db"))
    assert again.frame_bytes == 5 * frame
