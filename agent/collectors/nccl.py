"""`nccl` collector: receives the NCCL profiler plugin's datagrams (plugin/, docs/plugin.md)
on a Unix datagram socket and reports one summary per (process, communicator, rank) and a
`nccl_stall` event per stall message.

The kernel queues at most net.unix.max_dgram_qlen (default 10) datagrams on a Unix socket,
whatever SO_RCVBUF says, so a reader thread drains the socket as datagrams arrive into a
buffer bounded by `buffer_bytes`; collect() decodes what it holds.

Summaries carry per-interval deltas: those received within one agent interval are added up,
the cumulative fields (sequence numbers, in-flight op) come from the newest. A communicator
whose summaries stop (process gone) is dropped after `stale_intervals` of the plugin's
interval. The sender's pid comes from the kernel (SO_PASSCRED), so it is the pid in the
agent's namespace even for a containerised job, and the job id is read from that process.
"""
from __future__ import annotations

import grp
import operator
import os
import select
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import msgpack

from ..jobs import DEFAULT_KEYS, JobResolver
from ..plugin_proto import MAX_NS, Malformed, Message, Stalled, Summary, Waiting, decode
from ..unixsock import remove_stale
from .base import Collector, CollectorUnavailable, Context, Event, OptionError, Sample
from .options import check_keys, get_int, get_str_list

DEFAULT_RCVBUF = 4 << 20
DEFAULT_BUFFER = 32 << 20
MAX_COMMS = 1024  # the report's limit; more live communicators on one host are dropped
MAX_PEERS = 8192
MAX_COLLS = 64
MAX_WAITING = 4096
MAX_PENDING = 1024  # multi-part messages waiting for their other parts
PENDING_BYTES = 8 << 20  # ... and the bytes they hold: parts that never complete cost no more
MAX_PARTS = 64  # the largest summary (8,192 peers) takes 7 parts
MAX_STALE_S = 300.0  # expiry uses the plugin's interval, but never waits longer than this
MAX_STALLS = 64  # stall events per report interval, newest per (pid, comm, rank) first
SECTION_BYTES = 512 << 10  # the encoded section: the report must fit max_frame with the rest
U64_MAX = 2**64 - 1
LOGGED_REJECTS = 10
UCRED = struct.Struct("iII")
NS = 1e-9


@dataclass
class _Comm:
    """What one (pid, comm, rank) sent since the last report."""

    pid: int
    latest: Summary
    last_rx: float
    colls: dict[tuple[str, str, str], list[int]] = field(default_factory=dict)
    peers: dict[tuple[int, int, str], list[int]] = field(default_factory=dict)
    entry_wait_ns: int = 0
    entry_ops: int = 0


@dataclass
class _Pending:
    first_rx: float
    nparts: int
    interval_s: float
    parts: dict[int, Message] = field(default_factory=dict)
    size: int = 0  # bytes of the datagrams held


class NcclCollector(Collector):
    name = "nccl"
    untrusted = True
    OPTIONS = ("socket", "socket_group", "rcvbuf", "buffer_bytes", "stale_intervals", "job_env")

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        check_keys(self.name, options, self.OPTIONS)
        self.path = Path(self._str_option("socket") or ctx.run_dir / "plugin.sock")
        group = self._str_option("socket_group")
        try:
            self.gid = grp.getgrnam(group).gr_gid if group else None
        except KeyError:
            raise OptionError(f"collectors.nccl.socket_group: no group named {group!r}") from None
        self.rcvbuf = get_int(self.name, options, "rcvbuf", DEFAULT_RCVBUF, 1 << 16, 1 << 30)
        self.stale_intervals = get_int(self.name, options, "stale_intervals", 5, 1, 3600)
        self.buffer_bytes = get_int(self.name, options, "buffer_bytes", DEFAULT_BUFFER, 1 << 20,
                                    1 << 30)
        keys = get_str_list(self.name, options, "job_env")
        self.jobs = JobResolver(ctx.proc_root, DEFAULT_KEYS if keys is None else keys)
        self.malformed: Counter[str] = Counter()
        self.dropped = 0
        self._sock: socket.socket | None = None
        self._inode: int | None = None
        self._reader: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards the three below, shared with the reader
        self._buffer: list[tuple[bytes, int, int]] = []  # (datagram, recvmsg flags, pid)
        self._buffered = 0
        self._overflow = 0
        self._comms: dict[tuple[int, str, int], _Comm] = {}
        self._pending: dict[tuple[int, str, int, int], tuple[int, _Pending]] = {}
        self._pending_bytes = 0
        self._stalls: dict[tuple[int, str, int], Event] = {}  # newest per (pid, comm, rank)
        self._drops_seen: dict[int, int] = {}

    def _str_option(self, key: str) -> str | None:
        value = self.options.get(key)
        if value is not None and (not isinstance(value, str) or not value):
            raise OptionError(f"collectors.nccl.{key}: expected a non-empty string, "
                              f"got {value!r}")
        return value

    # ---- socket ----

    def start(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CollectorUnavailable(f"cannot create {self.path.parent}: {exc.strerror}") \
                from None
        try:  # a socket file left by a dead agent is removed; one still bound is someone's
            remove_stale(self.path, socket.SOCK_DGRAM)
        except OSError as exc:
            raise CollectorUnavailable(f"cannot listen on {self.path}: {exc.strerror}") from None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            sock.bind(str(self.path))
            os.chmod(self.path, 0o660)  # training users send through their group
            if self.gid is not None:
                os.chown(self.path, -1, self.gid)
            sock.setblocking(False)
            self._inode = os.stat(self.path).st_ino
        except OSError as exc:
            sock.close()
            raise CollectorUnavailable(f"cannot listen on {self.path}: {exc.strerror}") from None
        self._sock = sock
        self._stop.clear()
        self._reader = threading.Thread(target=self._read, args=(sock,), name="c4-nccl-reader",
                                        daemon=True)
        self._reader.start()

    def close(self) -> None:
        if self._sock is None:
            return
        self._stop.set()
        if self._reader is not None:
            self._reader.join()
        self._sock.close()
        self._sock = None
        try:
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    # ---- receiving ----

    def collect(self, now: float) -> Sample:
        if self._sock is None:
            raise RuntimeError("nccl collector used before start()")
        with self._lock:
            batch, self._buffer, self._buffered = self._buffer, [], 0
            self.dropped += self._overflow
            self._overflow = 0
        for data, flags, pid in batch:
            self._datagram(data, flags, pid, now)
        self._expire(now)
        comms: list[dict[str, Any]] = []
        encoded: list[bytes] = []
        size = 0
        for key in sorted(self._comms):
            c = self._comms[key]
            report = self._report(c) if len(comms) < MAX_COMMS else None
            # The report must fit in one frame with the other sections: past the budget a
            # communicator is left out this interval (counted) instead of the whole report.
            data = msgpack.packb(report) if report is not None else b""
            if report is not None and size + len(data) <= SECTION_BYTES:
                comms.append(report)
                encoded.append(data)
                size += len(data)
            else:
                self.dropped += 1
            c.colls.clear()
            c.peers.clear()
            c.entry_wait_ns = c.entry_ops = 0
            if c.latest.header.final:
                del self._comms[key]
        events = list(self._stalls.values())[-MAX_STALLS:]
        self.dropped += len(self._stalls) - len(events)
        self._stalls = {}
        rest = {"malformed": sum(self.malformed.values()), "dropped": self.dropped,
                "plugin_unsent": sum(self._drops_seen.values())}
        # The comms were encoded one by one above: the section's bytes are theirs joined
        # (the sender sends them as they are), its map the comms first as in `section`.
        pack = msgpack.Packer()
        parts = [pack.pack_map_header(1 + len(rest)), pack.pack("comms"),
                 pack.pack_array_header(len(comms)), *encoded]
        for k, v in rest.items():
            parts += (pack.pack(k), pack.pack(v))
        return Sample({"comms": comms, **rest}, events, b"".join(parts))

    def _read(self, sock: socket.socket) -> None:
        """Reader thread: moves datagrams from the socket to the bounded buffer."""
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        cmsg_space = socket.CMSG_SPACE(UCRED.size)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            while not self._stop.is_set():
                try:
                    data, ancdata, flags, _ = sock.recvmsg(1 << 16, cmsg_space)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    self.ctx.log.error("nccl: reading %s failed: %s", self.path, exc)
                    return
                pid = 0
                for level, kind, payload in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                        pid = UCRED.unpack_from(payload)[0]
                with self._lock:
                    if self._buffered + len(data) > self.buffer_bytes:
                        self._overflow += 1
                    else:
                        self._buffer.append((data, flags, pid))
                        self._buffered += len(data)

    def backlog(self) -> int:
        """Datagrams received and not yet processed by collect()."""
        with self._lock:
            return len(self._buffer)

    def _datagram(self, data: bytes, flags: int, pid: int, now: float) -> None:
        try:
            if flags & socket.MSG_TRUNC:
                raise Malformed("too_large", "datagram truncated at 64 KiB")
            msg = decode(data)
            self._part(pid or msg.header.pid, msg, len(data), now)
        except Malformed as exc:
            self._reject(exc.reason, f"{exc}", pid)
        except Exception as exc:  # any process in the socket's group can write: never crash
            self._reject("error", f"{type(exc).__name__}: {exc}", pid)

    def _reject(self, reason: str, detail: str, pid: int) -> None:
        self.malformed[reason] += 1
        if sum(self.malformed.values()) <= LOGGED_REJECTS:
            self.ctx.log.warning("nccl: rejected a datagram from pid %d: %s", pid, detail[:200])

    def _part(self, pid: int, msg: Message, size: int, now: float) -> None:
        h = msg.header
        self._note_drops(pid, h.dgram_drops)
        if h.nparts == 1:
            self._complete(pid, [msg], now)
            return
        if h.nparts > MAX_PARTS:
            raise Malformed("field", f"{h.nparts} parts (at most {MAX_PARTS})")
        key = (pid, h.comm, h.rank, h.type)
        seq, pending = self._pending.get(key, (h.msg_seq, None))
        if pending is not None and seq != h.msg_seq:  # a newer message: the old one is lost
            self._drop_pending(key)
            pending = None
        if pending is None:
            if len(self._pending) >= MAX_PENDING:
                self.dropped += 1
                return
            pending = _Pending(now, h.nparts, min(h.interval_ms / 1000, MAX_STALE_S))
        if h.nparts != pending.nparts or h.part in pending.parts:
            raise Malformed("field", f"part {h.part} of {h.nparts} does not fit its message")
        if self._pending_bytes + size > PENDING_BYTES:
            self.dropped += 1
            return
        pending.parts[h.part] = msg
        pending.size += size
        self._pending_bytes += size
        self._pending[key] = (h.msg_seq, pending)
        if len(pending.parts) == pending.nparts:
            self._pending_bytes -= pending.size
            del self._pending[key]
            self._complete(pid, [pending.parts[i] for i in range(pending.nparts)], now)

    def _drop_pending(self, key: tuple[int, str, int, int]) -> None:
        _, pending = self._pending.pop(key)
        self.dropped += len(pending.parts)
        self._pending_bytes -= pending.size

    def _note_drops(self, pid: int, drops: int) -> None:
        if drops > self._drops_seen.get(pid, 0):
            if pid not in self._drops_seen:
                self.ctx.log.warning("nccl: the plugin in pid %d could not send %d datagrams "
                                     "(agent absent or its socket buffer full)", pid, drops)
            self._drops_seen[pid] = drops

    def _complete(self, pid: int, parts: list[Message], now: float) -> None:
        first = parts[0]
        if isinstance(first, Stalled):
            waiting = [w for p in parts if isinstance(p, Stalled) for w in p.waiting]
            rank_key = (pid, first.header.comm, first.header.rank)
            if rank_key in self._stalls:  # a newer stall of the same rank replaces the older
                del self._stalls[rank_key]
                self.dropped += 1
            elif len(self._stalls) >= MAX_STALLS:
                self.dropped += 1
                return
            self._stalls[rank_key] = self._stall_event(pid, first, waiting)
            return
        assert isinstance(first, Summary)
        key = (pid, first.header.comm, first.header.rank)
        c = self._comms.get(key)
        if c is None:
            if len(self._comms) >= 4 * MAX_COMMS:
                self.dropped += len(parts)
                return
            c = self._comms[key] = _Comm(pid, first, now)
        c.latest, c.last_rx = first, now
        # Sums are clamped to what the report schema holds: a datagram listing one peer twice
        # with 2^64-1 bytes must not overflow the encoder (or get the whole report refused).
        c.entry_wait_ns = min(c.entry_wait_ns + first.entry_wait_ns, MAX_NS - 1)
        c.entry_ops += first.entry_ops
        for coll in first.colls:
            coll_key = (coll.func, coll.algo, coll.proto)
            if coll_key in c.colls or len(c.colls) < MAX_COLLS:
                _add(c.colls.setdefault(coll_key, [0, 0, 0]), (coll.count, coll.bytes, coll.time_ns),
                     (U64_MAX, U64_MAX, MAX_NS - 1))
        for part in parts:
            assert isinstance(part, Summary)
            for p in part.peers:
                peer_key = (p.peer, p.channel, p.dir)
                if peer_key in c.peers or len(c.peers) < MAX_PEERS:
                    _add(c.peers.setdefault(peer_key, [0, 0, 0, 0, 0]),
                         (p.bytes, p.steps, p.net_wait_ns, p.peer_wait_ns, p.gpu_wait_ns),
                         (U64_MAX, U64_MAX, MAX_NS - 1, MAX_NS - 1, MAX_NS - 1))

    def _expire(self, now: float) -> None:
        # On the agent's clock, with the plugin's interval capped: a sender claiming a day-long
        # interval does not keep its state for days.
        for key, c in list(self._comms.items()):
            interval = min(c.latest.header.interval_ms / 1000, MAX_STALE_S)
            if now - c.last_rx > self.stale_intervals * interval:
                del self._comms[key]
        live = {pid for pid, _, _ in self._comms}
        self._drops_seen = {pid: n for pid, n in self._drops_seen.items() if pid in live}
        for part_key, (_, pending) in list(self._pending.items()):
            if now - pending.first_rx > self.stale_intervals * pending.interval_s:  # parts lost
                self._drop_pending(part_key)

    # ---- report ----

    def _report(self, c: _Comm) -> dict[str, Any]:
        s, h = c.latest, c.latest.header
        colls = []
        for (func, algo, proto), (count, nbytes, time_ns) in sorted(c.colls.items()):
            coll: dict[str, Any] = {"func": func, "count": min(count, 2**32 - 1),
                                    "bytes": nbytes, "time_s": time_ns * NS}
            if algo:
                coll["algo"] = algo
            if proto:
                coll["proto"] = proto
            colls.append(coll)
        peers = [{"peer": peer, "channel": ch, "dir": d, "bytes": b, "steps": steps,
                  "net_wait_s": net * NS, "peer_wait_s": pw * NS, "gpu_wait_s": gpu * NS}
                 for (peer, ch, d), (b, steps, net, pw, gpu) in sorted(c.peers.items())]
        inflight = None
        if s.inflight is not None:
            inflight = {"seq": s.inflight.seq, "func": s.inflight.func,
                        "age_s": s.inflight.age_ns * NS,
                        "progress_age_s": s.inflight.progress_age_ns * NS}
        job, dev = self.jobs.lookup(c.pid)
        return {
            "comm": h.comm, "rank": h.rank, "nranks": h.nranks,
            "seq_started": s.seq_started, "seq_completed": s.seq_completed,
            "colls": colls, "peers": peers, "pid": c.pid, "job": job, "dev": dev,
            "inflight": inflight, "entry_wait_s": c.entry_wait_ns * NS,
            "entry_ops": min(c.entry_ops, 2**32 - 1), "dropped_events": s.dropped_events,
        }

    def _stall_event(self, pid: int, s: Stalled, waiting: list[Waiting]) -> Event:
        h = s.header
        waits = [{"peer": w.peer, "channel": w.channel, "dir": w.dir, "state": w.state,
                  "idle_s": w.idle_ns * NS} for w in waiting[:MAX_WAITING]]
        on = ", ".join(f"rank {w.peer} ({w.dir} ch {w.channel}, {w.state})" for w in waiting[:4])
        more = f" and {len(waiting) - 4} more" if len(waiting) > 4 else ""
        msg = (f"rank {h.rank}/{h.nranks} of communicator {h.comm} (pid {pid}) made no progress "
               f"for {s.age_ns * NS:.1f} s in {s.func} #{s.seq}; waiting on "
               f"{on or 'no connection'}{more}")
        attrs = {"comm": h.comm, "rank": h.rank, "nranks": h.nranks, "seq": s.seq,
                 "func": s.func, "age_s": s.age_ns * NS, "waiting": waits, "pid": pid,
                 "job": self.jobs.job_of(pid), "seq_completed": s.seq_completed}
        return Event("nccl_stall", "error", attrs, msg=msg)


def _add(acc: list[int], values: tuple[int, ...], caps: tuple[int, ...]) -> None:
    acc[:] = map(min, map(operator.add, acc, values), caps)  # per peer: no Python-level loop
