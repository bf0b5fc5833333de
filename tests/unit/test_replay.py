"""Replay of a recording with bad frames in it: counted like live ingest, state intact."""
from __future__ import annotations

from pathlib import Path

from c4.aggregator.replay import replay
from c4.core import record

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "agent.c4rec"


def test_bad_frames_are_counted_and_the_rest_replayed(tmp_path: Path) -> None:
    frames = list(record.read(GOLDEN))
    rec = tmp_path / "mixed.c4rec"
    with record.Writer(rec) as w:
        w.write(b"\xc1 not msgpack")  # before any timestamp
        for i, f in enumerate(frames):
            w.write(f)
            if i == 2:
                w.write(b"\x93\x01\x02\x03")  # a msgpack array, not a frame
    clean = replay(GOLDEN)
    mixed = replay(rec)
    assert mixed.stats["rejected"]["malformed"] == 2
    assert mixed.frames == len(frames) + 2
    assert mixed.hosts == clean.hosts and mixed.stats["accepted"] == clean.stats["accepted"]
