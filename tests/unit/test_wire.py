"""Wire protocol v1: encoding, validation and every rejection reason, on raw bytes."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from c4.core import record, wire
from c4.core.wire import Frame, Rejected, kinds

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "wire" / "agent.c4rec"


def _raw(**over) -> dict:
    f = {"v": [1, 0], "kind": "ack", "host": "gpu-01", "boot": "abc", "seq": 7, "ts": 1.5,
         "body": {"boot": "b", "seq": 3}}
    f.update(over)
    return f


def _reason(data: bytes, max_frame: int = wire.DEFAULT_MAX_FRAME) -> str:
    with pytest.raises(Rejected) as exc:
        wire.decode(data, max_frame)
    return exc.value.code


def test_roundtrip_every_kind() -> None:
    bodies = {
        "hello": {"agent_version": "0.1", "interval": 1.0, "collectors": {"host": {"ok": True}},
                  "nics": [{"dev": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE"}]}]},
        "report": {"interval": 1.0, "health": {"rdma": {"ok": False, "reason": "no device"}}},
        "ack": {"boot": "b", "seq": 3},
        "plan": {"plan_id": "p1", "assignments": [{"id": "a1", "proto": "roce", "sport": 49160,
                                                    "lqpn": 256, "rqpn": 512}]},
        "plan_result": {"plan_id": "p1", "applied": [], "failed": [{"id": "a1", "reason": "x"}]},
        "error": {"code": "bad_body", "reason": "why", "ref_seq": None},
    }
    for kind, body in bodies.items():
        f = Frame(kind, "gpu-01", "boot1", 5, 1700000000.25, body, floor=2)
        back = wire.decode(wire.encode(f))
        assert back == f


def test_golden_recording_decodes() -> None:
    frames = [wire.decode(b) for b in record.read(GOLDEN)]
    assert frames[0].kind == "hello"
    assert {f.kind for f in frames} >= {"hello", "report"}
    assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
    assert len({f.boot for f in frames}) == 1
    report = next(f for f in frames if f.kind == "report")
    assert report.body["rdma"]["ports"]


@pytest.mark.parametrize("data,reason", [
    (b"\xc1\xc1\xc1", "malformed"),                     # 0xc1 is never valid msgpack
    (msgpack.packb([1, 2, 3]), "malformed"),           # not a map
    (msgpack.packb({1: 2}), "malformed"),              # non-string key
    (msgpack.packb(_raw(seq=-1)), "bad_envelope"),
    (msgpack.packb(_raw(ts=float("nan"))), "bad_envelope"),
    (msgpack.packb(_raw(host="")), "bad_envelope"),
    (msgpack.packb({k: v for k, v in _raw().items() if k != "boot"}), "bad_envelope"),
    (msgpack.packb(_raw(v=[2, 0])), "unsupported_version"),
    (msgpack.packb(_raw(kind="gossip")), "unknown_kind"),
    (msgpack.packb(_raw(body={"boot": "b", "seq": "3"})), "bad_body"),
    (msgpack.packb(_raw(body={"boot": "b", "seq": 3, "extra": 1})), "bad_body"),
    (msgpack.packb(_raw(kind="event", body={"type": "no_such_event", "severity": "info",
                                            "attrs": {}})), "bad_body"),
    (msgpack.packb(_raw(kind="event", body={"type": "port_state", "severity": "loud",
                                            "attrs": {}})), "bad_body"),
    (msgpack.packb(_raw(kind="report", body={"interval": 1.0, "health": {},
                                             "rdma": {"ports": [{"dev": "m", "port": 0,
                                                                 "state": "x",
                                                                 "counters": {}}]}})),
     "bad_body"),
])
def test_rejections(data: bytes, reason: str) -> None:
    assert _reason(data) == reason


def test_size_limits() -> None:
    big = msgpack.packb(_raw(body={"boot": "b" * 5000, "seq": 1}))
    assert _reason(big, max_frame=4096) == "too_large"
    # A declared length beyond the limit inside a small frame is refused by msgpack itself.
    assert _reason(b"\xdb\xff\xff\xff\xff" + b"x" * 10, max_frame=4096) == "malformed"
    ext = msgpack.packb(msgpack.ExtType(1, b"x"))
    assert _reason(ext) == "malformed"


def test_rejection_keeps_envelope_for_reply() -> None:
    with pytest.raises(Rejected) as exc:
        wire.decode(msgpack.packb(_raw(v=[3, 1])))
    assert exc.value.frame["host"] == "gpu-01" and exc.value.frame["seq"] == 7
    assert "3.1 is not supported" in exc.value.detail


def test_encode_refuses_invalid_body() -> None:
    with pytest.raises(wire.Invalid):
        wire.encode(Frame("ack", "h", "b", 1, 0.0, {"boot": "b"}))


def test_direction_sets_cover_all_kinds() -> None:
    assert kinds.FROM_AGENT < set(kinds.BODIES)
    assert set(kinds.BODIES) - kinds.FROM_AGENT == {"ack", "plan", "probe", "error"}


def test_generated_docs_are_current() -> None:
    out = subprocess.run([sys.executable, "-m", "c4.cli.docs", "--check"], capture_output=True,
                         text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
