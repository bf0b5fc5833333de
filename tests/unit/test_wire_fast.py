"""The C fast path (c4.core.wire.fast) accepts exactly what the DSL validator accepts, returns
the same frames, and rejects with the same reason, on frames drawn from the schemas themselves
(hypothesis), the golden recording, c4 sim output and hostile shapes."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from c4.core import record, wire
from c4.core.wire import Rejected, fast, kinds
from c4.core.wire.schema import Bool, Enum, Float, Int, List, Map, Nullable, Record, Spec, Str
from c4.core.wire.sections import EVENTS

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "agent.c4rec"


def outcome(decode: Any, data: bytes) -> Any:
    try:
        return decode(data)
    except Rejected as exc:
        return ("rejected", exc.code, exc.detail)


def typed(v: Any) -> Any:
    """A value with the type of every leaf (1 == 1.0, but a body must keep what came)."""
    if isinstance(v, dict):
        return {k: typed(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [typed(x) for x in v]
    if isinstance(v, wire.Frame):
        return typed(v.to_dict())
    return (type(v).__name__, v)


def same(data: bytes) -> Any:
    ref = outcome(wire.decode, data)
    assert typed(outcome(fast.decode, data)) == typed(ref)
    return ref


def env(kind: str, body: Any, **over: Any) -> bytes:
    f = {"v": [1, 0], "kind": kind, "host": "gpu-01", "boot": "b00t", "seq": 7, "ts": 1.5,
         "body": body}
    f.update(over)
    return msgpack.packb(f, use_bin_type=True)


def test_every_kind_and_event_has_a_fast_path() -> None:
    assert fast.FAST_KINDS == set(kinds.BODIES)
    assert fast.FAST_EVENTS == set(EVENTS)


def test_golden_recording_takes_the_fast_path_with_the_same_frames() -> None:
    frames = list(record.read(GOLDEN))
    for data in frames:
        assert fast._unpack(data) is not None  # accepted in C, not by falling back
        same(data)


def test_sim_frames_take_the_fast_path(tmp_path: Path) -> None:
    from c4.lab.sim import SimConfig, simulate

    out = tmp_path / "sim.c4rec"
    simulate(SimConfig(hosts=4, gpus_per_host=8, leaves=2, spines=2, duration=3, seed=1), out)
    for data in record.read(out):
        assert fast._unpack(data) is not None
        same(data)


# ------------------------------------------------------------------------------ hostile shapes
PEER = {"peer": 1, "channel": 0, "dir": "send", "bytes": 1, "steps": 1, "net_wait_s": 0.0}
COMM = {"comm": "0" * 16, "rank": 0, "nranks": 2, "seq_started": 1, "seq_completed": 1,
        "colls": [], "peers": [PEER]}


def report(**sections: Any) -> dict[str, Any]:
    return {"interval": 1.0, "health": {}, **sections}


@pytest.mark.parametrize("body", [
    report(nccl={"comms": [{**COMM, "comm": "0" * 15 + "\n"}]}),   # `$` would allow the newline
    report(nccl={"comms": [{**COMM, "comm": "0" * 15 + "G"}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "dir": "both"}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "bytes": -1}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "bytes": 2**64 - 1}]}]}),  # valid
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "peer": True}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "net_wait_s": math.nan}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "net_wait_s": math.inf}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "net_wait_s": 3}]}]}),    # int: valid
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "net_wait_s": 10**7 + 1}]}]}),
    report(nccl={"comms": [{**COMM, "peers": [{**PEER, "extra": 1}]}]}),
    report(nccl={"comms": [{**COMM, "job": None, "inflight": None}]}),           # nil: valid
    report(nccl={"comms": [COMM] * 1025}),
    report(host={"cpu_pct": 1, "load1": 0, "mem_used_bytes": 1, "mem_total_bytes": 2,
                 "uptime_s": 1e10 + 1}),
    report(rdma={"ports": [{"dev": "mlx5_0", "port": 1, "state": "ACTIVE",
                            "counters": {"bad-name": 1}}]}),
    report(rdma={"ports": [{"dev": "mlx5_0", "port": 1, "state": "ACTIVE",
                            "counters": {"x" * 97: 1}}]}),
    report(rdma={"ports": [{"dev": "mlx5_0", "port": 1, "state": "ACTIVE",
                            "counters": {"rx": 1}, "rates": {"rx": -1.5}}]}),     # valid
    report(rdma={"ports": [{"dev": "mlx5_0", "port": 1, "state": "ACTIVE",
                            "counters": {"rx": 1}, "rates": {"rx": -math.inf}}]}),
    report(kmsg={"records": 1, "events": 0, "ignored": 0, "malformed": 0, "overwritten": 0,
                 "by_type": {"Xid": 1}}),
    {"interval": 1.0},
    {"interval": 1.0, "health": {}, b"raw": 1},
    {"interval": 1.0, "health": {"é" * 65: {"ok": True}}},
    [1, 2],
    None,
])
def test_hostile_report_bodies(body: Any) -> None:
    same(env("report", body))


@pytest.mark.parametrize("etype,attrs", [
    ("port_state", {"dev": "mlx5_0", "port": 1, "from": "ACTIVE", "to": "DOWN"}),
    ("port_state", {"dev": "mlx5_0", "port": 1, "from": "ACTIVE"}),
    ("nic_link", {"pci": "0000:5e:00.0", "netdev": "eth0", "state": "sideways"}),
    ("xid", {"code": 79, "pci": "0000:3b:00", "pid": None, "process": None, "text": "gone"}),
    ("xid", {"code": 79, "pci": "0000:3B:00", "pid": None, "process": None, "text": "gone"}),
    ("no_such_event", {}),
])
def test_events(etype: str, attrs: dict[str, Any]) -> None:
    same(env("event", {"type": etype, "severity": "error", "attrs": attrs}))


def test_deep_nesting_and_envelope_faults_are_the_reference_s() -> None:
    deep = b"\x91" * 100000 + b"\xc0"  # past msgpack's own depth limit: malformed
    raw = msgpack.packb({"v": [1, 0], "kind": "report", "host": "h", "boot": "b", "seq": 1,
                         "ts": 1.0, "body": {"interval": 1.0, "health": {}, "x": 0}})
    assert same(raw.replace(msgpack.packb("x") + b"\x00", msgpack.packb("x") + deep))[1] == "malformed"
    for data in (b"\xc1", msgpack.packb([1]), env("report", report(), seq=True),
                 env("report", report(), v=[2, 0]), env("gossip", {}),
                 env("report", report(), host="-bad"), env("ack", {"boot": "b", "seq": 1})):
        same(data)


def test_duplicate_keys_are_judged_as_the_reference_keeps_them() -> None:
    # msgpack keeps the last of duplicate keys; the fast path must judge that one.
    head = b"\x87" + b"".join(msgpack.packb(x) for x in (
        "v", [1, 0], "kind", "report", "host", "h", "boot", "b", "seq", 1, "ts", 1.0))
    good, bad = msgpack.packb(report()), msgpack.packb({"interval": -1.0, "health": {}})
    body = msgpack.packb("body")
    two_bodies = b"\x88" + head[1:] + body + good + body + bad
    assert same(two_bodies)[1] == "bad_body"
    assert not isinstance(same(b"\x88" + head[1:] + body + bad + body + good), tuple)
    interval = msgpack.packb("interval")
    dup_field = b"\x83" + interval + msgpack.packb(1.0) + msgpack.packb("health") + b"\x80" \
        + interval + msgpack.packb("x")
    assert same(b"\x87" + head[1:] + body + dup_field)[1] == "bad_body"


def test_name_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fast, "NAMES_CACHED", 8)
    for i in range(50):  # every name new: the cache is cleared, never grows past its bound
        ports = [{"dev": f"mlx5_{i}", "port": 1, "state": "ACTIVE", "counters": {f"c{i}": 1}}]
        same(env("report", report(rdma={"ports": ports})))
    same(env("report", report(rdma={"ports": [{"dev": "mlx5 0", "port": 1, "state": "A",
                                               "counters": {}}]})))


# ------------------------------------------------------------------------------ hypothesis
# Values drawn from the specs themselves: mostly valid, with boundary values, wrong types and
# unknown or missing fields mixed in at every level.
ANY = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                   max_size=3),
    max_leaves=6,
)


def _edge_ints(spec: Int) -> list[int]:
    out = [x for b in (spec.min, spec.max) if b is not None for x in (b - 1, b, b + 1)]
    return [x for x in out if -(2**63) <= x <= 2**64 - 1]


_MEMO: dict[int, st.SearchStrategy[Any]] = {}


def strategy(spec: Spec) -> st.SearchStrategy[Any]:
    """Valid 8 times in 10, a boundary or wrong value 1 in 10, anything 1 in 10."""
    s = _MEMO.get(id(spec))
    if s is None:
        valid, edge = _valid(spec), _edge(spec)
        s = _MEMO[id(spec)] = st.integers(0, 9).flatmap(
            lambda i: valid if i < 8 else edge if i < 9 else ANY)
    return s


def _valid(spec: Spec) -> st.SearchStrategy[Any]:
    if isinstance(spec, Int):
        lo = -(2**63) if spec.min is None else spec.min
        hi = 2**64 - 1 if spec.max is None else spec.max
        return st.integers(lo, hi)
    if isinstance(spec, Float):
        return st.floats(spec.min, spec.max, allow_nan=False, allow_infinity=False) | st.integers(
            math.ceil(spec.min) if spec.min is not None else -(2**63),
            math.floor(spec.max) if spec.max is not None else 2**64 - 1)
    if isinstance(spec, Str):
        s = (st.from_regex(spec.pattern, fullmatch=True) if spec.pattern
             else st.text(max_size=min(spec.max_len, 12)))
        return s.filter(lambda v: spec.min_len <= len(v) <= spec.max_len)
    if isinstance(spec, Bool):
        return st.booleans()
    if isinstance(spec, Enum):
        return st.sampled_from(spec.values)
    if isinstance(spec, Nullable):
        return st.none() | strategy(spec.inner)
    if isinstance(spec, List):
        return st.lists(strategy(spec.item), min_size=spec.min_len,
                        max_size=min(spec.max_len, max(spec.min_len, 2)))
    if isinstance(spec, Map):
        keys = strategy(spec.key).map(lambda k: k if isinstance(k, (str, int, float, bytes))
                                      else repr(k))  # wrong keys, but hashable
        return st.dictionaries(keys, strategy(spec.value), max_size=min(spec.max_len, 3))
    if isinstance(spec, Record):
        return st.fixed_dictionaries(
            {k: strategy(s) for k, s in spec.required.items()},
            optional={k: strategy(s) for k, s in spec.optional.items()})
    raise TypeError(spec)


def _edge(spec: Spec) -> st.SearchStrategy[Any]:
    if isinstance(spec, Int):
        return st.sampled_from(_edge_ints(spec) or [0]) | st.just(True) | st.just(1.0)
    if isinstance(spec, Float):
        edges = [b for b in (spec.min, spec.max) if b is not None]
        return st.sampled_from([math.nan, math.inf, -math.inf, False, *edges,
                                *(math.nextafter(b, math.inf) for b in edges),
                                *(math.nextafter(b, -math.inf) for b in edges)])
    if isinstance(spec, Str):
        base = _valid(spec)
        return (base.map(lambda v: v + "\n") | base.map(lambda v: "-" + v)
                | st.just("x" * (spec.max_len + 1)) | st.just("é" * spec.max_len)
                | st.just(""))
    if isinstance(spec, List):
        return st.lists(_valid(spec.item), min_size=spec.max_len + 1,
                        max_size=spec.max_len + 1) if spec.max_len <= 4 else st.just(())
    if isinstance(spec, Record):
        base = _valid(spec)
        return (base.map(lambda d: {**d, "unknown_field": 1})
                | base.map(lambda d: dict(list(d.items())[1:])))
    return ANY


BODY = {k: strategy(s) for k, s in kinds.BODIES.items() if k != "event"}
EVENT = st.sampled_from(sorted(EVENTS)).flatmap(
    lambda t: st.fixed_dictionaries({"type": st.just(t), "severity": strategy(kinds.SEVERITY),
                                     "attrs": strategy(EVENTS[t])}))
FRAMES = st.one_of(
    *(b.map(lambda body, k=k: env(k, body)) for k, b in BODY.items()),
    EVENT.map(lambda body: env("event", body)),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(FRAMES)
def test_fast_path_agrees_with_the_dsl(data: bytes) -> None:
    same(data)


def test_one_unpack_and_numbers_as_they_came(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fast path unpacks a frame once (issue 15): msgpack, the reference's unpacker, is not
    # called at all; an int where the DSL asks for a number stays an int in the body.
    data = env("report", {"interval": 1, "health": {}, "rdma": {"ports": [
        {"dev": "mlx5_0", "port": 1, "state": "ACTIVE", "counters": {"port_rcv_data": 5}}]}})

    def no_unpack(*a: Any, **kw: Any) -> Any:
        raise AssertionError("unpacked by msgpack")

    monkeypatch.setattr(msgpack, "unpackb", no_unpack)
    frame = fast.decode(data)
    assert type(frame.body["interval"]) is int
    monkeypatch.undo()
    assert typed(frame) == typed(wire.decode(data))
