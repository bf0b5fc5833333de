"""The plugin socket is untrusted (issue 10): any process in its group can write to it. Hostile
datagrams cost a counter; they never crash the agent, grow it without bound, flood the
aggregator with events, or lose the report's other sections."""
from __future__ import annotations

import os
from pathlib import Path

import msgpack

from c4.agent.collectors import nccl as nccl_mod
from c4.agent.collectors.base import Sample
from c4.agent.collectors.nccl import NcclCollector
from c4.agent.config import AgentConfig
from c4.agent.daemon import Agent
from c4.core.wire.kinds import validate_body
from tests import plugin_dgram as dg
from tests.unit.test_nccl_collector import NOW, _report, collector, ctx, send  # noqa: F401

U64 = 2**64 - 1


def test_sums_over_the_schema_are_clamped_not_crashed(collector, send) -> None:  # noqa: F811
    twice = [(1, 0, 0, U64), (1, 0, 0, U64)]  # one peer listed twice with 2^64-1 bytes
    send(dg.summary(twice, colls=2, entry_wait_ns=10**16 - 1),
         dg.summary(twice, colls=1, entry_wait_ns=10**16 - 1))
    section = collector.collect(NOW).section
    nccl = _report(section)  # valid against the report schema
    msgpack.packb(section)  # and encodable
    (comm,) = nccl["comms"]
    assert comm["peers"][0]["bytes"] == U64
    assert comm["colls"][0]["bytes"] == U64 and comm["colls"][0]["time_s"] <= 1e7


def test_anything_a_datagram_raises_is_a_counted_reject(ctx) -> None:  # noqa: F811
    c = NcclCollector(ctx, {})
    # A state the decoder cannot produce today, standing for whatever the next bug is.
    c._part = lambda *a: (_ for _ in ()).throw(OverflowError("int too big"))  # type: ignore
    c._datagram(dg.summary([(1, 0, 0, 1)]), 0, os.getpid(), NOW)
    assert c.malformed["error"] == 1


def test_partial_messages_are_capped_by_bytes_and_expire(ctx, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(nccl_mod, "PENDING_BYTES", 64 << 10)
    c = NcclCollector(ctx, {})
    part = dg.summary([(1, 0, 0, 1)] * 1000, nparts=2, interval_ms=2**32 - 1)
    # Never-completed messages from many "ranks": held up to the byte cap, the rest dropped.
    for rank in range(200):
        c._datagram(dg.summary([(1, 0, 0, 1)] * 1000, nparts=2, rank=rank, nranks=1000,
                               interval_ms=2**32 - 1), 0, 77, NOW)
    assert c._pending_bytes <= 64 << 10 and c.dropped >= 200 - (64 << 10) // len(part)
    # A day-long claimed interval does not keep them for days: the agent's clock, capped.
    c._expire(NOW + nccl_mod.MAX_STALE_S * c.stale_intervals + 1)
    assert c._pending == {} and c._pending_bytes == 0
    assert dg.summary([(1, 0, 0, 1)], nparts=65)  # more parts than any real message
    c._datagram(dg.summary([(1, 0, 0, 1)], nparts=65), 0, 77, NOW)
    assert c.malformed["field"] == 1


def test_communicators_claiming_a_long_interval_still_expire(ctx) -> None:  # noqa: F811
    c = NcclCollector(ctx, {})
    c._datagram(dg.summary([(1, 0, 0, 1)], interval_ms=2**32 - 1), 0, 77, NOW)
    assert len(c._comms) == 1
    c._expire(NOW + nccl_mod.MAX_STALE_S * c.stale_intervals + 1)
    assert c._comms == {}


def test_stall_events_per_interval_are_capped(ctx) -> None:  # noqa: F811
    c = NcclCollector(ctx, {})
    for i in range(16000):  # 16k stalls in one interval, from many made-up ranks
        c._datagram(dg.stalled(rank=i % 4000, nranks=4000, msg_seq=i), 0, 77, NOW)
    c._sock = object()  # type: ignore[assignment]  # collect() without a socket
    sample = c.collect(NOW)
    assert len(sample.events) == nccl_mod.MAX_STALLS
    assert sample.section["dropped"] == 16000 - nccl_mod.MAX_STALLS
    c._sock = None


def test_a_bad_untrusted_section_is_dropped_alone(tmp_path: Path) -> None:
    """The agent's report keeps its other sections when the nccl one fails the schema."""
    cfg = AgentConfig(aggregator="inproc://nobody", host="h1", insecure=True,
                      run_dir=tmp_path / "run", collectors={"enabled": []})
    agent = Agent(cfg)
    try:
        bad = Sample({"comms": [{"comm": "zz"}]}, [])
        agent.health["nccl"] = {"ok": True}
        agent._check("nccl", bad)
        assert bad.section is None and agent.sections_dropped == 1
        assert not agent.health["nccl"]["ok"] and "invalid" in agent.health["nccl"]["reason"]
        big = Sample({"comms": [], "malformed": 0, "dropped": 0}, [])
        agent._check("nccl", big)
        assert big.section is not None and agent.sections_dropped == 1
        body = {"interval": 1.0, "health": agent.health,
                "sender": {**agent.sender.counters(), "sections_dropped": 1}}
        validate_body("report", body)
    finally:
        agent.sender.close()


