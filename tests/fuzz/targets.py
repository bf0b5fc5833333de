"""Fuzz targets (issue 10): each takes bytes a peer could send and must either accept them or
refuse them the documented way. Anything else raised is a crash for the fuzzer.

- wire: `wire.decode` raises only `Rejected`;
- ingest: decode + accept on a real aggregator core (SQLite in memory, diagnosis, planner):
  no input may reach an internal error (those are contained in production, counted in
  `errors`; here they are bugs);
- plugin: `plugin_proto.decode` raises only `Malformed`;
- nccl: the collector's reassembly and report of a stream of datagrams (`u16 length` + bytes,
  repeated): the report and events it produces must pass the wire schema and encode;
- federation: a hostile peer's forward messages (header and frame parts, see `Forwards`),
  one at a time through the owner's real receive path (a ZeroMQ ROUTER) into diagnosis:
  anything but a counted reject escapes as a crash, `applied` never goes back within a boot,
  each message is counted once at most, and state is kept for configured peers only.
"""
from __future__ import annotations

import struct
from typing import Any, Callable, Iterator

TARGETS = ("wire", "ingest", "plugin", "nccl", "federation")


def build(name: str) -> Callable[[bytes], None]:
    """The target's one-input function (imports happen here, inside atheris'
    instrumentation when run by tests/fuzz/run.py)."""
    return {"wire": _wire, "ingest": _ingest, "plugin": _plugin, "nccl": _nccl,
            "federation": _federation}[name]()


def _wire() -> Callable[[bytes], None]:
    from c4.core import wire

    def one(data: bytes) -> None:
        try:
            wire.decode(data)
        except wire.Rejected:
            pass
    return one


def _ingest() -> Callable[[bytes], None]:
    import logging

    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import build_core

    logging.disable(logging.CRITICAL)  # rejects log; the fuzzer's output is its own
    clock = [1000.0]
    core = build_core(AggregatorConfig(), db_path=":memory:", clock=lambda: clock[0])
    ingest = core.ingest
    n = [0]

    def one(data: bytes) -> None:
        n[0] += 1
        clock[0] += 0.25
        ingest.handle(data, clock[0])
        ingest.take_acks(clock[0])
        if n[0] % 8 == 0:
            ingest.tick(clock[0])
        if ingest.errors:
            where, _ = ingest.errors.most_common(1)[0]
            raise AssertionError(f"internal error in {where} (see the log above)")
    return one


def _plugin() -> Callable[[bytes], None]:
    from c4.agent.plugin_proto import Malformed, decode

    def one(data: bytes) -> None:
        try:
            decode(data)
        except Malformed:
            pass
    return one


def _nccl() -> Callable[[bytes], None]:
    import logging
    import tempfile
    from pathlib import Path

    import msgpack

    from c4.agent.collectors.base import Context
    from c4.agent.collectors.nccl import NcclCollector
    from c4.core.wire.kinds import validate_body

    logging.disable(logging.CRITICAL)
    ctx = Context(host="fuzz", proc_root=Path(tempfile.mkdtemp()), run_dir=Path("/nonexistent"))

    def one(data: bytes) -> None:
        c = NcclCollector(ctx, {})
        c._sock = object()  # type: ignore[assignment]  # collect() without a socket
        now = 1000.0
        for dgram in split(data):
            c._datagram(dgram, 0, 4242, now)
            now += 0.01
        if c.malformed["error"]:
            raise AssertionError("a datagram raised something other than Malformed")
        sample = c.collect(now + 1.0)
        body = {"interval": 1.0, "health": {}, "nccl": sample.section}
        msgpack.packb(validate_body("report", body))
        for ev in sample.events:
            msgpack.packb(validate_body("event", ev.body()))
    return one


def split(data: bytes) -> list[bytes]:
    """`u16 length` + datagram, repeated (the nccl target's input format)."""
    out, off = [], 0
    while off + 2 <= len(data):
        (n,) = struct.unpack_from("<H", data, off)
        out.append(data[off + 2:off + 2 + n])
        off += 2 + n
    return out


def join(datagrams: list[bytes]) -> bytes:
    return b"".join(struct.pack("<H", len(d)) + d for d in datagrams)


# -- federation -------------------------------------------------------------------------------
# The owner is "a" of peers a, b, c; "zz" is no peer. Three boots and one that is no identifier.
PEERS = ("a", "b", "c")
SENDERS = ("b", "c", "a", "zz")
BOOTS = ("0123456789abcdef", "fedcba9876543210", "b00t", "no boot!")
HOSTS = ("h0", "h1", "h2", "h3")
COMM = "00000000000000c4"


def _owned(me: str, yes: bool) -> str:
    from c4.aggregator.federation import owner

    return next(j for j in (f"job-{i}" for i in range(1000)) if (owner(j, PEERS) == me) == yes)


def frames() -> list[bytes]:
    """Forwards a peer could send (valid and not) of each host: the frame part a `Forwards`
    record picks by index, so the fuzzer reaches the checks past decoding."""
    from c4.core import wire
    from c4.core.wire import Frame

    mine, theirs = _owned("a", True), _owned("a", False)

    def summary(job: str | None, rank: int, done: int) -> dict[str, Any]:
        return {"comm": COMM, "rank": rank, "nranks": 4, "seq_started": done + 1,
                "seq_completed": done, "pid": 100 + rank, "job": job, "dev": rank % 2,
                "colls": [{"func": "AllReduce", "count": 3, "bytes": 3 << 20, "time_s": 0.06}],
                "peers": [{"peer": (rank + 1) % 4, "channel": 0, "dir": "send",
                           "bytes": 1 << 20, "steps": 8, "net_wait_s": 0.01}],
                "inflight": {"seq": done, "func": "AllReduce", "age_s": 2.0}}

    def nccl(*comms: dict[str, Any]) -> dict[str, Any]:
        return {"interval": 1.0, "health": {}, "nccl": {"comms": list(comms)}}

    bodies: list[tuple[str, dict[str, Any]]] = [
        ("hello", {"agent_version": "t", "interval": 1.0, "collectors": {},
                   "nics": [{"dev": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE",
                                                         "netdev": "eth0", "rail": 0}]}],
                   "netdevs": [{"name": "eth0", "addrs": ["10.0.0.1/24"]}]}),
        ("report", nccl(summary(mine, 0, 5), summary(mine, 1, 5))),
        ("report", nccl(summary(mine, 2, 6))),
        ("report", nccl(summary(None, 3, 6))),  # no job id: owned as comm-<comm>
        ("report", nccl()),  # a host whose ranks ended
        ("report", nccl(summary(theirs, 0, 5))),  # not_owner
        ("report", {**nccl(summary(mine, 0, 5)), "health": {"cpu_pct": 1.0}}),  # a section
        ("report", {"interval": 1.0, "health": {}, "rdma": {"ports": []}}),
        ("event", {"type": "nccl_stall", "severity": "error", "attrs": {
            "comm": COMM, "rank": 1, "nranks": 4, "seq": 5, "func": "AllReduce",
            "age_s": 30.0, "seq_completed": 4, "job": mine,
            "waiting": [{"peer": 0, "channel": 0, "dir": "recv", "state": "RecvWait",
                         "idle_s": 30.0}]}}),
        ("event", {"type": "xid", "severity": "error", "attrs": {
            "code": 79, "pci": "0000:3b:00", "pid": None, "process": None, "text": "Xid 79"}}),
        ("ack", {"seq": 1}),  # travels aggregator -> agent
    ]
    return [wire.encode(Frame(kind, host, "b00t", 7, 1.0, body), validate=False)
            for kind, body in bodies for host in HOSTS]


class Forwards:
    """The federation target's input: records, each one multipart message of one peer.

    A record is an op byte, then its fields. op & 3: the parts (0, 3: header and frame; 1:
    the header alone; 2: header and two frames). op & 4: a raw header (u8 length + bytes),
    else a built one: sender u8, boot u8 (indexes modulo their lists), delta u8, [fseq u64],
    floor u8. (op >> 4) & 3: fseq is what the owner applied of that sender and boot + delta
    - 2 (0), or the u64 (1), its top 32 bits (2), its top 16 (3); op & 0x40: floor is fseq +
    1 + the u8, else fseq - the u8; op & 0x80 adds a fifth key. op & 8: a raw frame (u16
    length + bytes), else `frames()[u8]`."""

    def __init__(self, data: bytes) -> None:
        self.data, self.off = data, 0

    def take(self, n: int) -> bytes:
        out = self.data[self.off:self.off + n]
        self.off += n
        return out

    def num(self, n: int) -> int:
        return int.from_bytes(self.take(n).ljust(n, b"\0"), "little")

    def messages(self, applied: Callable[[str, str], int], frames: list[bytes]
                 ) -> Iterator[list[bytes]]:
        import msgpack

        while self.off < len(self.data):
            op = self.num(1)
            if op & 4:
                head = self.take(self.num(1))
            else:
                sender, boot = SENDERS[self.num(1) % 4], BOOTS[self.num(1) % 4]
                mode, delta = (op >> 4) & 3, self.num(1)
                fseq = (applied(sender, boot) + delta - 2 if mode == 0 else
                        self.num(8) >> (0, 0, 32, 48)[mode])
                floor = fseq + 1 + self.num(1) if op & 0x40 else fseq - self.num(1)
                floor = min(floor, (1 << 64) - 1)  # what msgpack can carry
                fields = {"from": sender, "boot": boot, "fseq": fseq, "floor": floor}
                head = msgpack.packb({**fields, "x": 0} if op & 0x80 else fields)
            frame = self.take(self.num(2)) if op & 8 else frames[self.num(1) % len(frames)]
            yield [[head, frame], [head], [head, frame, frame], [head, frame]][op & 3]


def forwards(records: list[tuple[int, bytes | tuple[int, int, int, int, int], bytes | int]]
             ) -> bytes:
    """Encode `Forwards` records (op, raw header or (sender, boot, delta, fseq, floor) indexes
    and numbers, raw frame or frame index): the seed corpus."""
    out = b""
    for op, head, frame in records:
        out += bytes([op])
        if isinstance(head, bytes):
            out += bytes([len(head)]) + head
        else:
            sender, boot, delta, fseq, floor = head
            out += bytes([sender, boot, delta])
            out += fseq.to_bytes(8, "little") if (op >> 4) & 3 else b""
            out += bytes([floor])
        out += (struct.pack("<H", len(frame)) + frame if isinstance(frame, bytes)
                else bytes([frame]))
    return out


def _federation() -> Callable[[bytes], None]:
    import logging

    import msgpack
    import zmq

    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.federation import (FORWARD_REJECTS, JOBS_CACHED, Federation,
                                          FederationConfig, Peer)
    from c4.aggregator.server import build_core
    from c4.core.wire import Frame, Rejected
    from c4.core.wire.names import IDENT

    logging.disable(logging.CRITICAL)
    clock = [1000.0]
    core = build_core(AggregatorConfig(), db_path=":memory:", clock=lambda: clock[0])
    diag = core.diagnosis

    def prepare(data: bytes) -> Frame | Exception:
        out = core.ingest.prepare(data)
        if isinstance(out, Exception) and not isinstance(out, Rejected):
            raise AssertionError(f"the decoder raised {out!r}") from out
        return out

    # No CURVE (keys None): the ZAP check of a sender's key is test_federation's; here the
    # header's sender is the identity, so every peer name is reachable.
    # the peers' own sockets are never bound: what is forwarded to them stays queued
    cfg = FederationConfig(name="a", listen="inproc://c4-fuzz-federation", peers=[
        Peer(n, f"inproc://c4-fuzz-away-{n}") for n in PEERS])
    fed = Federation(cfg, "ffffffffffffffff", None, 1 << 20, prepare, core.registry)
    peer = fed.zctx.socket(zmq.DEALER)
    peer.setsockopt(zmq.LINGER, 0)
    peer.connect(cfg.listen)
    cases = frames()
    applied_kinds = {"hello", "report", "event"}

    def apply(good: list[Frame]) -> None:  # Server._apply_forwarded, with errors escaping
        for f in good:
            assert f.kind in applied_kinds, f.kind
            diag.observe(f, clock[0])

    def counted() -> int:
        return fed.received + fed.duplicates + sum(fed.rejected.values())

    def applied(sender: str, boot: str) -> int:
        st = fed.inbound.get(sender)
        return st.applied if st is not None and st.boot == boot else 0

    def one(data: bytes) -> None:
        fed.inbound.clear()  # each input is a peer's stream from its start: reproducible
        for n, parts in enumerate(Forwards(data).messages(applied, cases)):
            if n == 64:
                break
            before = {k: (s.boot, s.applied, s.lost) for k, s in fed.inbound.items()}
            was = counted()
            clock[0] += 0.05
            peer.send_multipart(parts)
            fed.receive(apply)
            assert not fed.sock.poll(0), "a message was left unread"
            assert counted() - was in (0, 1), "a message counted twice"
            assert set(fed.inbound) <= {"b", "c"}, sorted(fed.inbound)
            assert set(fed.rejected) <= set(FORWARD_REJECTS), fed.rejected
            for k, s in fed.inbound.items():
                boot, was_applied, was_lost = before.get(k, (None, 0, 0))
                if boot == s.boot:
                    assert s.applied >= was_applied and s.lost >= was_lost, (k, before[k], s)
            while peer.poll(0):  # the owner's acks name a boot and what it applied of it
                ack = msgpack.unpackb(peer.recv())
                assert ack["boot"] == IDENT.check(ack["boot"]), ack
                assert type(ack["fseq"]) is int and 0 <= ack["fseq"] < 1 << 62, ack
        assert len(fed._owner_of) <= JOBS_CACHED
        if diag.errors:
            raise AssertionError(f"diagnosis skipped a forward it was given: {diag.errors}")
        diag.tick(clock[0])
    return one
