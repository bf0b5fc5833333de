"""Decoding the plugin's datagrams: golden captures from the real plugin (tests/fixtures/plugin,
`make -C plugin fixtures`) and malformed variants of them, each rejected with its reason."""
from __future__ import annotations

import random
import struct

import pytest

from c4.agent import plugin_proto as pp

CHUNK = 512 * 1024  # the harness's step size in summary.bin
OP_BYTES = 8 * 2 * CHUNK  # AllReduce payload per op: 8 steps x 2 halves


@pytest.fixture
def golden(fixtures):
    return {p.stem: p.read_bytes() for p in (fixtures / "plugin").glob("*.bin")}


def test_summary_of_a_ring_rank(golden):
    s = pp.decode(golden["summary"])
    assert isinstance(s, pp.Summary)
    h = s.header
    assert (h.type, h.comm, h.rank, h.nranks, h.part, h.nparts) == (
        pp.SUMMARY, "c4a11ed000000001", 3, 8, 0, 1)
    assert not h.final and h.interval_ms == 100
    (coll,) = s.colls
    assert (coll.func, coll.algo, coll.proto) == ("AllReduce", "Ring", "Simple")
    assert coll.count > 0 and coll.bytes == coll.count * OP_BYTES
    assert coll.time_ns > coll.count * 4 * 1_000_000  # >= 4 pipelined 1 ms network phases
    assert s.seq_completed >= coll.count and s.seq_started >= s.seq_completed
    assert s.entry_ops == coll.count and s.entry_wait_ns > 0
    # ring: send to rank 4, receive from rank 2, on channels 0 and 1
    assert {(p.peer, p.dir) for p in s.peers} == {(4, "send"), (2, "recv")}
    assert {p.channel for p in s.peers} == {0, 1}
    for p in s.peers:
        assert p.steps > 0 and p.bytes == p.steps * CHUNK
        assert p.net_wait_ns >= p.steps * 1_000_000
        assert (p.peer_wait_ns > 0) == (p.dir == "send")
        assert p.gpu_wait_ns > 0


def test_final_summary(golden):
    s = pp.decode(golden["summary_final"])
    assert isinstance(s, pp.Summary) and s.header.final
    assert s.inflight is None and s.seq_started == s.seq_completed > 0
    assert s.header.msg_seq > pp.decode(golden["summary"]).header.msg_seq


def test_stalled(golden):
    st = pp.decode(golden["stalled"])
    assert isinstance(st, pp.Stalled)
    assert (st.header.comm, st.header.rank, st.func) == ("c4a11ed000000004", 2, "AllReduce")
    assert st.seq == st.seq_completed  # the op after the last completed one
    assert st.age_ns >= 300_000_000 and st.op_age_ns >= st.age_ns
    (w,) = st.waiting
    assert (w.peer, w.channel, w.dir, w.state) == (1, 0, "recv", "RecvWait")
    assert w.idle_ns >= 300_000_000


def test_multipart_summary(golden):
    a, b = pp.decode(golden["multipart_0"]), pp.decode(golden["multipart_1"])
    assert isinstance(a, pp.Summary) and isinstance(b, pp.Summary)
    assert a.header.msg_seq == b.header.msg_seq and a.header.nparts == b.header.nparts == 2
    assert (a.header.part, b.header.part) == (0, 1)
    assert len(golden["multipart_0"]) <= pp.MAX_DGRAM
    assert [c.func for c in a.colls] == ["Send"] and a.colls[0].bytes == 2048 * 2 and not b.colls
    peers = a.peers + b.peers
    assert sorted(p.peer for p in peers) == list(range(1, 1501))
    assert all(p.dir == "send" and p.steps == 1 and p.bytes == 4096 for p in peers)


def test_v4_summary(golden):
    s = pp.decode(golden["summary_v4"])
    assert isinstance(s, pp.Summary)
    (coll,) = s.colls
    assert (coll.func, coll.algo, coll.proto, coll.count) == ("AllGather", "Ring", "LL128", 5)
    assert coll.bytes == 5 * 1000 * 8
    (p,) = s.peers
    assert (p.peer, p.dir, p.bytes, p.steps) == (0, "recv", 5 * 8000, 5)


def _mutate(data: bytes, fmt: str, offset: int, value: int) -> bytes:
    b = bytearray(data)
    struct.pack_into(fmt, b, offset, value)
    return bytes(b)


H = pp.HEADER.size
CASES = [
    # (name, fixture, mutation, reason)
    ("truncated header", "summary", lambda d: d[:40], "short"),
    ("oversized", "summary", lambda d: d + bytes(pp.MAX_DGRAM), "too_large"),
    ("magic", "summary", lambda d: _mutate(d, "<I", 0, 0x12345678), "magic"),
    ("version", "summary", lambda d: _mutate(d, "<H", 4, 2), "version"),
    ("type", "summary", lambda d: _mutate(d, "<B", 6, 9), "type"),
    ("rank >= nranks", "summary", lambda d: _mutate(d, "<I", 12, 8), "field"),
    ("part >= nparts", "summary", lambda d: _mutate(d, "<H", 20, 1), "field"),
    ("interval 0", "summary", lambda d: _mutate(d, "<I", 48, 0), "field"),
    ("trailing byte", "summary", lambda d: d + b"\0", "length"),
    ("peer count", "summary", lambda d: _mutate(d, "<H", H + 46, 5), "length"),
    ("truncated block", "summary", lambda d: d[:H + 20], "length"),
    ("too many colls", "summary", lambda d: _mutate(d, "<H", H + 44, 65), "field"),
    ("completed > started", "summary", lambda d: _mutate(d, "<Q", H, 0), "field"),
    ("duration", "summary", lambda d: _mutate(d, "<Q", H + 24, 10**17), "field"),
    ("has_inflight", "summary", lambda d: _mutate(d, "<B", H + 88, 7), "field"),
    ("func name", "summary", lambda d: d[:H + 96] + b"All-Reduce\0\0\0\0\0\0" + d[H + 112:],
     "field"),
    ("bytes after NUL", "summary", lambda d: _mutate(d, "<B", H + 96 + 14, 65), "field"),
    ("algo not ASCII", "summary", lambda d: _mutate(d, "<B", H + 112, 0xC3), "field"),
    ("peer >= nranks", "summary", lambda d: _mutate(d, "<I", H + 96 + 72, 8), "field"),
    ("direction", "summary", lambda d: _mutate(d, "<B", H + 96 + 72 + 6, 2), "field"),
    ("channel", "summary", lambda d: _mutate(d, "<H", H + 96 + 72 + 4, 4096), "field"),
    ("waiting count", "stalled", lambda d: _mutate(d, "<I", H + 48, 2), "length"),
    ("waiting peer", "stalled", lambda d: _mutate(d, "<I", H + 56, 99), "field"),
    ("waiting idle", "stalled", lambda d: _mutate(d, "<Q", H + 56 + 8, 10**17), "field"),
    # rows are checked all at once (by each field's largest value): the last of 1,275 counts too
    ("last peer >= nranks", "multipart_0", lambda d: _mutate(d, "<I", len(d) - 48, 2**32 - 1),
     "field"),
    ("last peer channel", "multipart_0", lambda d: _mutate(d, "<H", len(d) - 44, 1024), "field"),
    ("last peer direction", "multipart_0", lambda d: _mutate(d, "<B", len(d) - 42, 2), "field"),
    ("last peer gpu wait", "multipart_0", lambda d: _mutate(d, "<Q", len(d) - 8, 10**16),
     "field"),
]


@pytest.mark.parametrize("name,fixture,mutate,reason", CASES, ids=[c[0] for c in CASES])
def test_malformed_is_rejected_with_reason(golden, name, fixture, mutate, reason):
    with pytest.raises(pp.Malformed) as exc:
        pp.decode(mutate(golden[fixture]))
    assert exc.value.reason == reason and exc.value.reason in pp.REASONS


def test_every_truncation_is_rejected(golden):
    data = golden["summary"]
    for n in range(len(data)):
        with pytest.raises(pp.Malformed):
            pp.decode(data[:n])


def test_corruption_never_raises_anything_else(golden):
    rng = random.Random(4)
    for data in golden.values():
        for _ in range(300):
            b = bytearray(data)
            for _ in range(rng.randint(1, 4)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            try:
                pp.decode(bytes(b))
            except pp.Malformed:
                pass


def test_unknown_state_keeps_its_number(golden):
    d = _mutate(golden["stalled"], "<B", H + 56 + 7, 77)
    (w,) = pp.decode(d).waiting
    assert w.state == "State77"
