"""A section its collector already encoded (the nccl collector encodes each communicator to fit
the frame budget) is sent as those bytes, not encoded a second time by the sender: the frame
is byte for byte the encoding of the whole body."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import msgpack

from c4.agent.collectors import Collector, Context, Sample
from c4.agent.config import AgentConfig
from c4.agent.daemon import Agent
from c4.agent.sender import Sender
from c4.core import record, wire
from c4.core.wire import Frame

SECTION = {"comms": [], "malformed": 0, "dropped": 0, "plugin_unsent": 0}


class Encoded(Collector):
    """Hands over bytes that differ from its section (dropped 5, not 0): what reaches the
    wire shows which of the two the agent sent."""
    name = "nccl"

    def collect(self, now: float) -> Sample:
        return Sample(dict(SECTION), encoded=msgpack.packb(dict(SECTION, dropped=5)))


def test_the_agent_sends_the_collectors_bytes(tmp_path: Path) -> None:
    rec = tmp_path / "sent.c4rec"
    sender = Sender("tcp://127.0.0.1:9", "h1", record_path=str(rec), validate_every=1)
    cfg = AgentConfig(aggregator="tcp://127.0.0.1:9", host="h1", interval=0.3, metrics="",
                      run_dir=tmp_path / "run", collectors={"enabled": []})
    agent = Agent(cfg, sender=sender, collectors=[Encoded(Context(host="h1"), {})])
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    time.sleep(1.0)
    agent.stop_event.set()
    t.join(15)
    reports = [f.body for f in map(wire.decode, record.read(rec)) if f.kind == "report"]
    assert reports and all(r["nccl"]["dropped"] == 5 for r in reports)


def test_spliced_bytes_are_the_whole_frames_encoding() -> None:
    body = {"interval": 1.0, "health": {}, "nccl": dict(SECTION, dropped=3),
            "host": {"cpu_pct": 1.0, "mem_used_bytes": 1, "mem_total_bytes": 2, "load1": 0.1,
                     "uptime_s": 10.0}}
    for floor in (None, 1):
        f = Frame("report", "h1", "b00t", 2, 1.7e9, body, floor=floor)
        spliced = wire.encode(f, raw={"nccl": msgpack.packb(body["nccl"])})
        assert spliced == wire.encode(f) == msgpack.packb(f.to_dict())
        assert wire.decode(spliced) == f
