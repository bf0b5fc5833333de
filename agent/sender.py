"""Agent -> aggregator transport: a ZeroMQ DEALER with a bounded, ack-driven resend queue.

Every frame gets the next sequence number of this agent incarnation (`boot`) and stays in the
queue until the aggregator acks it (ack = highest contiguous seq stored). Frames that go
unacked for `resend_after` seconds are sent again; the aggregator drops duplicates. When the
queue is full the oldest frames are dropped and counted, and every frame carries `floor` (the
oldest seq still held) so the aggregator does not wait forever for a frame that is gone.
ZeroMQ reconnects by itself with exponential backoff (RECONNECT_IVL .. RECONNECT_IVL_MAX);
IMMEDIATE keeps it from queueing frames on a connection that does not exist yet.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import zmq

from c4.core import record, wire
from c4.core.keys import ClientKeys
from c4.core.wire import Frame, Rejected

from .spool import Spool


@dataclass
class _Pending:
    seq: int
    kind: str
    data: bytes
    sent_at: float | None = None  # None: not on the wire yet (or due again)


@dataclass
class SenderStats:
    sent: int = 0
    resent: int = 0
    dropped_queue_full: int = 0
    dropped_invalid: int = 0
    acked: int = 0
    errors_received: int = 0
    bad_replies: int = 0
    last_error: str = ""
    reconnects: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)


class Sender:
    def __init__(self, endpoint: str, host: str, *, queue_max: int = 10000,
                 queue_bytes: int = 64 << 20, spool_dir: str | Path | None = None,
                 resend_after: float = 5.0, max_frame: int = wire.DEFAULT_MAX_FRAME,
                 record_path: str | None = None, validate_every: int = 30,
                 clock: Callable[[], float] = time.time,
                 log: logging.Logger | None = None, ctx: zmq.Context[Any] | None = None,
                 curve: ClientKeys | None = None) -> None:
        self.endpoint = endpoint
        self.curve = curve  # None: plain TCP (`insecure = true`)
        self.host = host
        self.boot = uuid.uuid4().hex[:16]
        self.queue_max = queue_max
        self.queue_bytes = queue_bytes
        self.resend_after = resend_after
        self.max_frame = max_frame
        self.validate_every = max(1, validate_every)
        self.clock = clock
        self.log = log or logging.getLogger("c4.agent.sender")
        self.stats = SenderStats()
        self._seq = 0
        # Unacked frames by boot: earlier incarnations' (from the spool) first, then ours.
        self._queues: dict[str, deque[_Pending]] = {}
        self._bytes = 0  # encoded bytes held in all queues (and in the spool)
        self.spool: Spool | None = None
        if spool_dir:
            try:
                self.spool = Spool(spool_dir, self.boot, self.log)
                self._resume(self.spool.load())
            except OSError as exc:
                self.log.error("spool %s unusable (%s): unacked frames are kept in memory only, "
                               "a restart loses them", spool_dir, exc)
                self.spool = None
        self._queue: deque[_Pending] = deque()
        self._queues[self.boot] = self._queue
        self._last_ack_progress = clock()
        self._zctx = ctx or zmq.Context.instance()
        self._sock: zmq.Socket[Any] | None = None
        self._recorder = record.Writer(record_path) if record_path else None
        self.handlers: dict[str, Callable[[Frame], None]] = {}
        self._connect()

    # -- socket ---------------------------------------------------------------------------
    def _connect(self) -> None:
        s = self._zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.SNDHWM, 1000)
        s.setsockopt(zmq.RCVHWM, 1000)
        s.setsockopt(zmq.MAXMSGSIZE, self.max_frame)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        s.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        if self.curve is not None:
            self.curve.apply(s)
        s.connect(self.endpoint)
        self._sock = s

    def reconnect(self) -> None:
        """Drop the socket and start over: clears a pipe stuck to a peer that vanished."""
        if self._sock is not None:
            self._sock.close(0)
        self.stats.reconnects += 1
        self._connect()

    @property
    def socket(self) -> zmq.Socket[Any]:
        assert self._sock is not None
        return self._sock

    # -- sending --------------------------------------------------------------------------
    def send(self, kind: str, body: dict[str, Any],
             raw: Mapping[str, bytes] | None = None) -> int | None:
        """Queue a frame for delivery; returns its seq, or None if our own body was invalid
        (a bug worth a log line, never worth crashing the agent). `raw`: sections of `body`
        already encoded (wire.encode)."""
        seq = self._seq + 1
        frame = Frame(kind, self.host, self.boot, seq, self.clock(), body, floor=self._floor(seq))
        # Validating our own frames catches our bugs before the aggregator does, but costs as
        # much as collecting a big report: the first frame of each kind and every Nth after it.
        n = self.stats.by_kind.get(kind, 0)
        try:
            data = wire.encode(frame, validate=n % self.validate_every == 0, raw=raw)
        except wire.Invalid as exc:
            self.stats.dropped_invalid += 1
            self.log.error("not sending an invalid %s frame: %s", kind, exc)
            return None
        if len(data) > self.max_frame:
            self.stats.dropped_invalid += 1
            self.log.error("not sending a %s frame of %d bytes (max_frame %d)", kind, len(data),
                           self.max_frame)
            return None
        self._seq = seq
        if self._recorder is not None:
            self._recorder.write(data)
            self._recorder.flush()
        if not self.unacked:
            self._last_ack_progress = self.clock()  # the ack clock starts with the first pending frame
        while self.unacked and (len(self._queue) >= self.queue_max
                                or self._bytes + len(data) > self.queue_bytes):
            self._drop_oldest()
        self._queue.append(_Pending(seq, kind, data))
        self._bytes += len(data)
        self._spool("append", self.boot, seq, data)
        self.stats.by_kind[kind] = self.stats.by_kind.get(kind, 0) + 1
        self.flush()
        return seq

    def _resume(self, spooled: dict[str, list[tuple[int, bytes]]]) -> None:
        """Earlier incarnations' unacked frames, resent under their own boot and seq. Each is
        re-encoded with `floor` = the oldest of its boot still held, so the aggregator settles
        what the byte budget dropped instead of waiting for it."""
        for boot, frames in spooled.items():
            readable = []
            for seq, data in frames:
                try:
                    readable.append(wire.decode(data, self.max_frame))
                except (wire.Rejected, ValueError, OverflowError) as exc:
                    self.log.warning("spooled frame %s/%d unreadable, dropped: %s", boot, seq,
                                     exc)
            q: deque[_Pending] = deque()
            for f in readable:  # the floor is the oldest resent, not one dropped as unreadable
                data = self._with_floor(f, readable[0].seq)
                q.append(_Pending(f.seq, f.kind, data))
                self._bytes += len(data)
            if q:
                self._queues[boot] = q
                self.log.info("resending %d frames of an earlier run (boot %s) from the spool",
                              len(q), boot)
            elif self.spool is not None:  # nothing of that run can be resent: its file goes
                self.spool.settle(boot, frames[-1][0], list)

    @staticmethod
    def _with_floor(f: Frame, floor: int) -> bytes:
        return wire.encode(Frame(f.kind, f.host, f.boot, f.seq, f.ts, f.body, f.version, floor),
                           validate=False)

    def _refloor(self, boot: str, q: deque[_Pending]) -> None:
        """An earlier run's oldest held frame went: its new oldest carries the new floor, sent
        now (that run sends no new frames to carry it, and the aggregator acks no further than
        a seq it waits for)."""
        if boot == self.boot or not q:
            return
        head = q[0]
        data = self._with_floor(wire.decode(head.data, self.max_frame), head.seq)
        self._bytes += len(data) - len(head.data)
        head.data, head.sent_at = data, None

    def _drop_oldest(self) -> None:
        """The byte or frame budget is full: the oldest frame goes, counted (lost)."""
        boot, q = next((b, q) for b, q in self._queues.items() if q)
        p = q.popleft()
        self._bytes -= len(p.data)
        self.stats.dropped_queue_full += 1
        self._settled(boot, q, p.seq)
        self._refloor(boot, q)

    def _settled(self, boot: str, q: deque[_Pending], seq: int) -> None:
        if self.spool is not None:
            self._spool("settle", boot, seq, lambda: [(p.seq, p.data) for p in q])
        if not q and boot != self.boot:
            del self._queues[boot]

    def _spool(self, op: str, *args: Any) -> None:
        """A spool that cannot be written (full disk) is given up, loudly: delivery goes on
        from memory, without the restart guarantee."""
        if self.spool is None:
            return
        try:
            getattr(self.spool, op)(*args)
        except OSError as exc:
            self.log.error("spool write failed (%s): unacked frames are kept in memory only "
                           "from now on", exc)
            self.spool.close()
            self.spool = None

    def _floor(self, next_seq: int) -> int:
        return self._queue[0].seq if self._queue else next_seq

    def flush(self) -> None:
        """Put due frames on the wire without blocking; stops at the first EAGAIN."""
        now = self.clock()
        for p in [p for q in self._queues.values() for p in q]:
            if p.sent_at is not None and now - p.sent_at < self.resend_after:
                continue
            try:
                self.socket.send(p.data, zmq.NOBLOCK)
            except zmq.Again:
                return
            if p.sent_at is None:
                self.stats.sent += 1
            else:
                self.stats.resent += 1
            p.sent_at = now

    @property
    def unacked(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def counters(self) -> dict[str, int]:
        """What `report.body.sender` carries (docs/wire.md)."""
        st = self.stats
        return {"unacked": self.unacked, "resent": st.resent,
                "dropped_queue_full": st.dropped_queue_full, "dropped_invalid": st.dropped_invalid,
                "errors_received": st.errors_received, "reconnects": st.reconnects}

    @property
    def last_seq(self) -> int:
        return self._seq

    # -- receiving ------------------------------------------------------------------------
    def poll(self, timeout_s: float) -> None:
        """Wait up to timeout_s for replies, handle them, resend what is due."""
        deadline = self.clock() + max(0.0, timeout_s)
        while True:
            remaining = deadline - self.clock()
            if self.socket.poll(max(0, int(remaining * 1000)), zmq.POLLIN):
                while True:
                    try:
                        data = self.socket.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._on_reply(data)
            self.flush()
            self._maybe_reconnect()
            if self.clock() >= deadline:
                return

    def _maybe_reconnect(self) -> None:
        # Heartbeats make ZeroMQ notice a dead peer; this covers the rest (a peer that came
        # back with a new identity while our pipe still points at the old one).
        if self.unacked and self.clock() - self._last_ack_progress > 4 * self.resend_after:
            self.log.warning("no ack from %s for %.0fs with %d frames pending: reconnecting",
                             self.endpoint, self.clock() - self._last_ack_progress,
                             self.unacked)
            self._last_ack_progress = self.clock()
            self.reconnect()
            for q in self._queues.values():
                for p in q:
                    p.sent_at = None

    def _on_reply(self, data: bytes) -> None:
        try:
            frame = wire.decode(data, self.max_frame)
        except Rejected as exc:
            self.stats.bad_replies += 1
            self.log.warning("bad frame from the aggregator: %s", exc)
            return
        if frame.kind == "ack":
            self._on_ack(frame.body)
        elif frame.kind == "error":
            self.stats.errors_received += 1
            self.stats.last_error = f"{frame.body['code']}: {frame.body['reason']}"
            self.log.error("aggregator rejected frame %s: %s", frame.body.get("ref_seq"),
                           self.stats.last_error)
            self._forget(frame.body.get("ref_seq"), frame.body.get("ref_boot") or self.boot)
        elif frame.kind in self.handlers:
            self.handlers[frame.kind](frame)
        else:
            self.stats.bad_replies += 1
            self.log.warning("unexpected %s frame from the aggregator", frame.kind)

    def _forget(self, seq: int | None, boot: str) -> None:
        """A rejected frame will be rejected again: resending it would hold the queue's floor
        (and the aggregator's ack) forever. Drop it; the aggregator counts it as lost."""
        q = self._queues.get(boot, deque())
        for i, p in enumerate(q):
            if p.seq == seq:
                q.remove(p)
                self._bytes -= len(p.data)
                self.stats.dropped_invalid += 1
                if self.spool is not None:  # settled: a restart must not resend it
                    self._spool("forget", boot, p.seq)
                if i == 0:
                    self._refloor(boot, q)
                return

    def _on_ack(self, body: dict[str, Any]) -> None:
        boot = body["boot"]
        q = self._queues.get(boot)
        if q is None:
            return  # an incarnation whose frames are all settled
        acked = body["seq"]
        progressed = False
        while q and q[0].seq <= acked:
            self._bytes -= len(q.popleft().data)
            self.stats.acked += 1
            progressed = True
        if progressed:
            self._settled(boot, q, acked)
        if progressed or not self.unacked:
            self._last_ack_progress = self.clock()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        if self._recorder is not None:
            self._recorder.close()
        if self.spool is not None:
            self.spool.close()
