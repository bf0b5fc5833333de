"""Decoding of the NCCL profiler plugin's datagrams (layout: plugin/src/wire.h, documented in
docs/plugin.md#datagram-format).

Nothing from the socket is trusted: `decode` checks sizes, counts and ranges and raises
`Malformed(reason, detail)` with a short reason from REASONS, which the collector counts.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass

MAGIC = 0x504E3443  # bytes "C4NP"
VERSION = 1
MAX_DGRAM = 61440
SUMMARY, STALLED = 1, 2
FLAG_FINAL = 1
DIRS = ("send", "recv")
MAX_RANKS = 1 << 24
MAX_CHANNEL = 1023
MAX_COLLS = 64
MAX_NS = 10**16  # 1e7 s: the report schema's bound on a duration

# NCCL proxy-step states (ncclProfilerEventState_t) a waiting connection can be in.
STATE_NAMES = {
    0: "Idle",  # proxy op active, no step in a known state
    8: "SendGPUWait",
    9: "SendWait",
    10: "RecvWait",
    11: "RecvFlushWait",
    12: "RecvGPUWait",
    20: "SendPeerWait",
}

HEADER = struct.Struct("<IHBBIIIHHQQQIIQ")
SUMMARY_BLOCK = struct.Struct("<QQQQQIHHQQQ16sB7x")
COLL = struct.Struct("<16s16s16sQQQ")
PEER = struct.Struct("<IHBxQQQQQ")
STALLED_BLOCK = struct.Struct("<QQQQ16sI4x")
WAITING = struct.Struct("<IHBBQ")
assert (HEADER.size, SUMMARY_BLOCK.size, COLL.size, PEER.size, STALLED_BLOCK.size,
        WAITING.size) == (64, 96, 72, 48, 56, 16)

REASONS = ("short", "too_large", "magic", "version", "type", "length", "field")

_FUNC = re.compile(r"[A-Za-z]{1,15}")
_NAME = re.compile(r"[!-~]{0,15}")  # printable ASCII, no space


class Malformed(ValueError):
    """A datagram that cannot be accepted; `reason` is one of REASONS."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Header:
    type: int
    flags: int
    pid: int  # in the sender's pid namespace
    rank: int
    nranks: int
    part: int
    nparts: int
    comm: str  # 16 lower-case hex digits
    msg_seq: int
    wall_ns: int
    interval_ms: int
    nnodes: int
    dgram_drops: int

    @property
    def final(self) -> bool:
        return bool(self.flags & FLAG_FINAL)


@dataclass(frozen=True, slots=True)
class Coll:
    func: str
    algo: str
    proto: str
    count: int
    bytes: int
    time_ns: int


@dataclass(frozen=True, slots=True)
class Peer:
    peer: int
    channel: int
    dir: str
    bytes: int
    steps: int
    net_wait_ns: int
    peer_wait_ns: int
    gpu_wait_ns: int


@dataclass(frozen=True, slots=True)
class Inflight:
    seq: int
    func: str
    age_ns: int
    progress_age_ns: int


@dataclass(frozen=True, slots=True)
class Summary:
    header: Header
    seq_started: int
    seq_completed: int
    dropped_events: int
    span_ns: int
    entry_wait_ns: int
    entry_ops: int
    inflight: Inflight | None
    colls: tuple[Coll, ...]
    peers: tuple[Peer, ...]


@dataclass(frozen=True, slots=True)
class Waiting:
    peer: int
    channel: int
    dir: str
    state: str
    idle_ns: int


@dataclass(frozen=True, slots=True)
class Stalled:
    header: Header
    seq: int
    seq_completed: int
    age_ns: int
    op_age_ns: int
    func: str
    waiting: tuple[Waiting, ...]


Message = Summary | Stalled


def decode(data: bytes) -> Message:
    """Decode one datagram or raise Malformed."""
    if len(data) < HEADER.size:
        raise Malformed("short", f"{len(data)} bytes, a header is {HEADER.size}")
    if len(data) > MAX_DGRAM:
        raise Malformed("too_large", f"{len(data)} bytes > {MAX_DGRAM}")
    (magic, version, typ, flags, pid, rank, nranks, part, nparts, comm, msg_seq, wall_ns,
     interval_ms, nnodes, drops) = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise Malformed("magic", f"magic {magic:#010x}, expected {MAGIC:#010x}")
    if version != VERSION:
        raise Malformed("version", f"version {version}, this agent reads {VERSION}")
    if typ not in (SUMMARY, STALLED):
        raise Malformed("type", f"unknown message type {typ}")
    _require(0 < nranks <= MAX_RANKS and rank < nranks, f"rank {rank} of {nranks}")
    _require(part < nparts, f"part {part} of {nparts}")
    _require(interval_ms > 0, "interval 0")
    header = Header(typ, flags, pid, rank, nranks, part, nparts, f"{comm:016x}", msg_seq,
                    wall_ns, interval_ms, nnodes, drops)
    body = memoryview(data)[HEADER.size:]
    return _summary(header, body) if typ == SUMMARY else _stalled(header, body)


def _summary(h: Header, body: memoryview) -> Summary:
    _at_least(body, SUMMARY_BLOCK.size)
    (started, completed, dropped, span, entry_wait, entry_ops, ncolls, npeers, in_seq, in_age,
     progress_age, in_func, has_inflight) = SUMMARY_BLOCK.unpack_from(body)
    _require(ncolls <= MAX_COLLS, f"{ncolls} collective records")
    _exactly(body, SUMMARY_BLOCK.size + ncolls * COLL.size + npeers * PEER.size)
    _require(has_inflight in (0, 1), f"has_inflight {has_inflight}")
    _require(completed <= started, f"{completed} completed of {started} started")
    _durations(span, entry_wait, in_age, progress_age)
    inflight = (Inflight(in_seq, _func(in_func), in_age, progress_age) if has_inflight
                else None)
    off = SUMMARY_BLOCK.size
    colls = []
    for func, algo, proto, count, nbytes, time_ns in COLL.iter_unpack(
            body[off:off + ncolls * COLL.size]):
        _durations(time_ns)
        colls.append(Coll(_func(func), _name(algo), _name(proto), count, nbytes, time_ns))
    off += ncolls * COLL.size
    rows = list(PEER.iter_unpack(body[off:]))
    if rows:  # each field checked by its largest value: a summary can list 8,192 peers
        peer, channel, d, _, _, net, peer_wait, gpu = map(max, zip(*rows))
        _connection(h, peer, channel, d)
        _durations(net, peer_wait, gpu)
    peers = tuple([Peer(peer, channel, DIRS[d], nbytes, steps, net, peer_wait, gpu)
                   for peer, channel, d, nbytes, steps, net, peer_wait, gpu in rows])
    return Summary(h, started, completed, dropped, span, entry_wait, entry_ops, inflight,
                   tuple(colls), peers)


def _stalled(h: Header, body: memoryview) -> Stalled:
    _at_least(body, STALLED_BLOCK.size)
    seq, completed, age, op_age, func, nwaiting = STALLED_BLOCK.unpack_from(body)
    _exactly(body, STALLED_BLOCK.size + nwaiting * WAITING.size)
    _durations(age, op_age)
    rows = list(WAITING.iter_unpack(body[STALLED_BLOCK.size:]))
    if rows:  # as for a summary's peers: each field checked by its largest value
        peer, channel, d, _, idle = map(max, zip(*rows))
        _connection(h, peer, channel, d)
        _durations(idle)
    waiting = tuple([Waiting(peer, channel, DIRS[d], STATE_NAMES.get(state, f"State{state}"),
                             idle) for peer, channel, d, state, idle in rows])
    return Stalled(h, seq, completed, age, op_age, _func(func), waiting)


def _require(ok: bool, detail: str) -> None:
    if not ok:
        raise Malformed("field", detail)


def _at_least(body: memoryview, size: int) -> None:
    if len(body) < size:
        raise Malformed("length", f"body of {len(body)} bytes, the fixed block is {size}")


def _exactly(body: memoryview, size: int) -> None:
    if len(body) != size:
        raise Malformed("length", f"body of {len(body)} bytes, its counts say {size}")


def _durations(*values: int) -> None:
    for v in values:
        _require(v < MAX_NS, f"duration {v} ns out of range")


def _connection(h: Header, peer: int, channel: int, d: int) -> None:
    _require(peer < h.nranks, f"peer {peer} of {h.nranks} ranks")
    _require(channel <= MAX_CHANNEL, f"channel {channel}")
    _require(d < len(DIRS), f"direction {d}")


def _text(raw: bytes) -> str:
    value, _, rest = raw.partition(b"\0")
    if rest.strip(b"\0"):
        raise Malformed("field", f"name {raw!r} has bytes after its NUL")
    try:
        return value.decode("ascii")
    except UnicodeDecodeError:
        raise Malformed("field", f"name {raw!r} is not ASCII") from None


def _func(raw: bytes) -> str:
    value = _text(raw)
    _require(_FUNC.fullmatch(value) is not None, f"function name {value!r}")
    return value


def _name(raw: bytes) -> str:
    value = _text(raw)
    _require(_NAME.fullmatch(value) is not None, f"name {value!r}")
    return value
