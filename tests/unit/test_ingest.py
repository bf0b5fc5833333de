"""Ingest on real SQLite: dedupe, acks, loss accounting, full disk, restart, silence."""
from __future__ import annotations

from pathlib import Path

from c4.core import wire
from c4.core.wire import Frame

from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect


def _ingest(db: Path | str = ":memory:") -> Ingest:
    return Ingest(Store(connect(db)), HostRegistry(), None, silent_after=3.0)


def _report(seq: int, boot: str = "b1", floor: int | None = None, host: str = "h1") -> bytes:
    return wire.encode(Frame("report", host, boot, seq, 100.0 + seq,
                             {"interval": 1.0, "health": {}}, floor=floor))


def _ack(ing: Ingest) -> dict:
    (host, frame), = ing.take_acks(0.0)
    return frame.body


def test_out_of_order_and_duplicates() -> None:
    ing = _ingest()
    for seq in (1, 2, 4):
        assert ing.handle(_report(seq), 1.0).reject is None
    assert _ack(ing) == {"boot": "b1", "seq": 2}  # 3 is missing: ack stops at 2
    assert ing.handle(_report(4), 1.0).duplicate
    ing.handle(_report(3), 1.0)
    assert _ack(ing) == {"boot": "b1", "seq": 4}
    assert ing.duplicates == 1 and ing.accepted["report"] == 4
    assert ing.registry.hosts["h1"].reports == 4


def test_floor_settles_frames_the_agent_dropped() -> None:
    ing = _ingest()
    ing.handle(_report(1), 1.0)
    ing.handle(_report(5, floor=4), 1.0)  # the agent's queue overflowed: 2 and 3 are gone
    assert _ack(ing) == {"boot": "b1", "seq": 3}  # settled up to the floor; 4 may still come
    ing.handle(_report(4, floor=4), 1.0)
    assert _ack(ing) == {"boot": "b1", "seq": 5}
    assert ing.registry.hosts["h1"].seqs["b1"].lost == 2


def test_restart_recognises_what_is_stored(tmp_path: Path) -> None:
    db = tmp_path / "c4.db"
    ing = _ingest(db)
    for seq in (1, 2, 3, 5):
        ing.handle(_report(seq), 1.0)
    ing.store.conn.close()
    ing2 = _ingest(db)  # a restarted aggregator
    assert ing2.handle(_report(2), 2.0).duplicate
    assert _ack(ing2) == {"boot": "b1", "seq": 3}
    ing2.handle(_report(4), 2.0)
    assert _ack(ing2) == {"boot": "b1", "seq": 5}
    rows = ing2.store.frames("h1")
    assert [r[2] for r in rows] == [1, 2, 3, 4, 5]


def _event(seq: int) -> bytes:
    return wire.encode(Frame("event", "h1", "b1", seq, 1.0, {
        "type": "port_state", "severity": "warning", "msg": "x" * 2000,
        "attrs": {"dev": "mlx5_0", "port": 1, "from": "ACTIVE", "to": "DOWN"}}))


def test_full_disk_is_not_acked_and_recovers(tmp_path: Path) -> None:
    ing = _ingest(tmp_path / "c4.db")
    ing.handle(_report(1), 1.0)
    ing.take_acks(1.0)
    pages = ing.store.conn.execute("PRAGMA page_count").fetchone()[0]
    ing.store.conn.execute(f"PRAGMA max_page_count={pages}")  # SQLite's real "disk is full"
    seq = 2
    while (out := ing.handle(_event(seq), 2.0)).reject is None:  # fill what is left
        seq += 1
        assert seq < 100
    assert out.reject == "store_error" and ing.store_errors == 1
    assert dict((h, f.body["seq"]) for h, f in ing.take_acks(2.0)) == {"h1": seq - 1}
    ing.handle(_event(seq), 2.5)  # resent while still full: still not stored, not acked
    assert ing.take_acks(2.5) == [] and ing.store_errors == 2
    ing.store.conn.execute("PRAGMA max_page_count=1073741823")
    assert ing.handle(_event(seq), 3.0).reject is None
    assert dict((h, f.body["seq"]) for h, f in ing.take_acks(3.0)) == {"h1": seq}


def test_host_goes_silent_and_comes_back() -> None:
    seen = []

    class Sink:
        def observe(self, frame, now):
            seen.append(("frame", frame.kind))

        def tick(self, now):
            pass

        def host_silent(self, host, last_seen, now):
            seen.append(("silent", host, now))

        def host_back(self, host, now):
            seen.append(("back", host, now))

    ing = Ingest(Store(connect(":memory:")), HostRegistry(), Sink(), silent_after=3.0)
    ing.handle(_report(1), 10.0)
    ing.tick(12.0)
    assert ing.registry.hosts["h1"].status == "up"
    ing.tick(13.5)
    assert ing.registry.hosts["h1"].status == "silent"
    ing.tick(20.0)  # reported once, not every tick
    ing.handle(_report(2), 21.0)
    assert ing.registry.hosts["h1"].status == "up"
    assert seen == [("frame", "report"), ("silent", "h1", 13.5), ("back", "h1", 21.0),
                    ("frame", "report")]


def test_agent_bound_kinds_are_refused() -> None:
    ing = _ingest()
    out = ing.handle(wire.encode(Frame("plan", "h1", "b", 1, 1.0,
                                       {"plan_id": "p", "assignments": []})), 1.0)
    assert out.reject == "unexpected_kind"
    (reply,) = out.replies
    assert reply.kind == "error" and reply.body["code"] == "unexpected_kind"
    assert ing.store.frames() == []
