"""Single hostile frames (issue 10): each costs one reject and a counter, never the process.

Every case here stopped or froze the aggregator before: an OverflowError from SQLite, a bad
version unpacked, an error reply that failed its own check, a RecursionError while building a
message, a loop as long as a claimed number.
"""
from __future__ import annotations

import msgpack
import pytest

from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry, SeqState
from c4.aggregator.store import Store, connect
from c4.core import wire
from c4.core.wire import Frame, Rejected

SEQ_MAX = 2**63 - 1
# Some of these looped for as long as a claimed number before: fail instead of hanging.
pytestmark = pytest.mark.timeout(20)


def _ingest() -> Ingest:
    return Ingest(Store(connect(":memory:")), HostRegistry(), None)


def _env(**over: object) -> dict:
    f: dict = {"v": [1, 0], "kind": "report", "host": "h1", "boot": "b1", "seq": 1, "ts": 1.0,
               "body": {"interval": 1.0, "health": {}}}
    f.update(over)
    return f


def _raw(**over: object) -> bytes:
    return msgpack.packb(_env(**over))


def _check_reply(out) -> dict:
    """The error reply must pass the same validation any frame the aggregator sends does."""
    (reply,) = out.replies
    wire.decode(wire.encode(reply))
    return reply.body


@pytest.mark.parametrize("field,value", [
    ("seq", 2**63), ("seq", 2**64 - 1), ("floor", 2**63), ("floor", 2**64 - 1),
    ("seq", True), ("floor", False),
    ("v", [1]), ("v", []), ("v", [1, 0, 0]), ("v", [True, 0]),
])
def test_envelope_out_of_range_is_one_reject(field: str, value: object) -> None:
    ing = _ingest()
    out = ing.handle(_raw(**{field: value}), 1.0)
    assert out.reject == "bad_envelope"
    assert ing.rejected["bad_envelope"] == 1
    body = _check_reply(out)
    assert body["ref_seq"] in (None, 1)
    assert ing.store.frames() == []


def test_bool_seq_is_not_echoed_as_ref_seq() -> None:
    out = _ingest().handle(_raw(seq=True), 1.0)
    assert _check_reply(out)["ref_seq"] is None


def test_largest_storable_seq_is_accepted() -> None:
    ing = _ingest()
    assert ing.handle(_raw(seq=SEQ_MAX, floor=SEQ_MAX), 1.0).reject is None
    assert [r[2] for r in ing.store.frames()] == [SEQ_MAX]


def test_floor_above_own_seq_is_refused() -> None:
    # `floor` is the oldest seq the sender still holds, and it holds the frame it sends.
    out = _ingest().handle(_raw(seq=5, floor=6), 1.0)
    assert out.reject == "bad_envelope"


def _nested(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"  # [[[...[nil]...]]]: msgpack's own limit is ~1,000


@pytest.mark.parametrize("where", ["severity", "dir"])
def test_deeply_nested_enum_value_is_rejected_with_a_short_reason(where: str) -> None:
    deep = msgpack.ExtType(0, b"")  # placeholder swapped for raw bytes below
    if where == "severity":
        body = {"type": "port_state", "severity": deep,
                "attrs": {"dev": "mlx5_0", "port": 1, "from": "ACTIVE", "to": "DOWN"}}
        frame = _env(kind="event", body=body)
    else:
        peer = {"peer": 1, "channel": 0, "dir": deep, "bytes": 1, "steps": 1, "net_wait_s": 0.0}
        comm = {"comm": "0" * 16, "rank": 0, "nranks": 2, "seq_started": 1, "seq_completed": 1,
                "colls": [], "peers": [peer]}
        frame = _env(body={"interval": 1.0, "health": {}, "nccl": {"comms": [comm]}})
    packed = msgpack.packb(frame).replace(msgpack.packb(deep), _nested(1000))
    ing = _ingest()
    out = ing.handle(packed, 1.0)
    assert out.reject == "bad_body"
    assert len(_check_reply(out)["reason"]) < 300


def test_long_unknown_key_is_named_briefly() -> None:
    out = _ingest().handle(_raw(body={"interval": 1.0, "health": {}, "k" * 100000: 1}), 1.0)
    assert out.reject == "bad_body"
    assert len(_check_reply(out)["reason"]) < 300


@pytest.mark.timeout(10)
def test_huge_floor_costs_work_proportional_to_stored_frames() -> None:
    ing = _ingest()
    ing.handle(_raw(seq=1), 1.0)
    ing.handle(_raw(seq=3), 1.0)
    big = 2**62
    assert ing.handle(_raw(seq=big, floor=big), 1.0).reject is None
    s = ing.registry.hosts["h1"].seqs["b1"]
    assert s.contiguous == big and s.lost == big - 3  # 1 and 3 stored, the rest never came
    (_, ack), = ing.take_acks(1.0)
    assert ack.body["seq"] == big


def test_settle_below_counts_missing_without_walking_the_gap() -> None:
    s = SeqState(contiguous=2, above={5, 7, 10**15})
    s.settle_below(10**15)
    assert s.contiguous == 10**15 and s.lost == 10**15 - 1 - 2 - 2
    assert s.above == set()


def test_reject_reason_names_are_the_documented_set() -> None:
    ing = _ingest()
    for data in (_raw(seq=2**64 - 1), b"\xc1", _raw(kind="gossip")):
        ing.handle(data, 1.0)
    assert set(ing.stats()["rejected"]) == set(wire.REJECT_REASONS)
    assert sum(ing.stats()["rejected"].values()) == 3


def test_decoder_never_raises_anything_but_rejected() -> None:
    # A few shapes that once escaped as other exception types.
    for data in (_raw(v=[1]), _raw(v=[]), _raw(seq=2**64 - 1), _raw(seq=True, floor=True)):
        with pytest.raises(Rejected):
            wire.decode(data)
    # The encoder guards our own output: an invalid ref_seq never leaves the aggregator.
    with pytest.raises(wire.Invalid):
        wire.encode(Frame("error", "a", "b", 1, 1.0, {"code": "x", "reason": "y",
                                                       "ref_seq": True}))
