"""Several aggregators, one per pod; a job that spans pods is diagnosed by one of them, its owner
(docs/scaling.md, "Beyond one machine").

Each aggregator stores its own agents' frames and runs host-level detection for them. The
job-level sections, the NCCL summaries of a job owned by another aggregator (and that job's
`nccl_stall` events, and the hello of a host that has ranks in it, for its NIC inventory), are
forwarded to the owner once committed here; the owner feeds them to its diagnosis as if they
came from that host, and no other aggregator diagnoses that job. Ownership is rendezvous
hashing of the job id over the peer names (`owner`): every aggregator computes the same owner
from the same peer list, and adding a peer moves only the jobs it now wins.

Forwarding is at least once and in order per peer link: a bounded queue per peer (bytes),
forward sequence numbers, acks from the owner after it applied a frame, go-back-N resends
after `resend_after` without progress, and a `floor` (the oldest fseq still held) so that
frames dropped from a full queue are counted as lost by both ends instead of awaited. Ingest
never waits for a peer: sending is non-blocking and a full queue drops its oldest frame.

Peers speak on their own socket (`[federation] listen`) with CURVE and their own ZAP handler
that admits only the configured peer keys; agents' keys are not admitted there, peers' keys
not on the agents' socket. A peer may name hosts that are not its own only here, and only in
the frames it forwards: hello, reports with the `nccl` section alone, `nccl_stall` events, of
jobs this aggregator owns; anything else is rejected with a reason and counted.
"""
from __future__ import annotations

import hashlib
import logging
import re
import time
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import msgpack
import zmq
from zmq.utils import z85

from c4.core import wire
from c4.core.config import ConfigError, field
from c4.core.wire import Frame, Rejected
from c4.core.wire.names import IDENT

from .auth import ZapHandler, curve_server
from .state import HostRegistry

FORWARD_REJECTS = ("malformed", "identity", "not_owner", "unexpected_section",
                   "unexpected_kind", "bad_frame", "too_many_hosts")
# A host keeps forwarding (an empty summary list at worst) to an owner this long after its last
# summary of that owner's jobs: the owner must see the host report without a rank whose process
# ended (model.exited) instead of a rank that merely went quiet.
STICKY_S = 600.0
JOBS_CACHED = 65536  # job -> owner and comm -> owner memos (bounded: job ids come from agents)
DRAIN_FRAMES = 512
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,62}")


@dataclass
class Peer:
    name: str = field("", "the aggregator's name in the federation (the same in every "
                      "aggregator's `peers`)")
    endpoint: str = field("", "its `[federation] listen` endpoint as this aggregator reaches "
                          "it, e.g. `tcp://10.0.0.2:9466` (unused for this aggregator itself)")
    public_key: str = field("", "its CURVE public key (Z85, 40 characters: the `.key` twin of "
                            "its `server_secret_key`); may be empty only with `insecure = true`")


@dataclass
class FederationConfig:
    name: str = field("", "this aggregator's name among `peers`; required when `peers` is set")
    listen: str = field("tcp://0.0.0.0:9466", "ZeroMQ endpoint where peer aggregators' forward "
                        "frames arrive (CURVE; only `peers`' keys are admitted)")
    peers: list[Peer] = field([], "every aggregator of the federation, this one included, in "
                              "any order: jobs are owned by rendezvous hashing over their names "
                              "(docs/scaling.md); empty: no federation, nothing is forwarded")
    queue_bytes: int = field(64 << 20, "forward frames held per peer at most, in bytes; past "
                             "it the oldest are dropped and counted (ingest never waits)")
    window: int = field(256, "forward frames in flight (sent, not acked) per peer at most")
    resend_after: float = field(5.0, "seconds without an ack before the frames in flight to "
                                "a peer are sent again")
    max_peer_hosts: int = field(16384, "distinct host names one peer's forwards may name at a "
                                "time; a name's place frees after `[diagnosis] host_expire_s` "
                                "without a forward naming it; past it a forward naming a new "
                                "host is rejected (`too_many_hosts`): a compromised peer cannot "
                                "grow this aggregator's diagnosis memory with invented hosts")

    @property
    def enabled(self) -> bool:
        return bool(self.peers)

    def validate(self, where: str) -> None:
        if not self.peers:
            return
        names = [p.name for p in self.peers]
        for p in self.peers:
            if not NAME.fullmatch(p.name):
                raise ConfigError(f"{where}.peers: name {p.name!r}: letters, digits, '_.-', "
                                  "at most 63 characters")
            if p.name != self.name and not p.endpoint.startswith(("tcp://", "ipc://")):
                raise ConfigError(f"{where}.peers: {p.name}: endpoint must be a ZeroMQ tcp:// "
                                  f"or ipc:// endpoint, got {p.endpoint!r}")
            if p.public_key and (len(p.public_key) != 40 or not _z85_ok(p.public_key)):
                raise ConfigError(f"{where}.peers: {p.name}: public_key is not a Z85 CURVE key")
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.peers: names must be unique, got {sorted(names)}")
        if self.name not in names:
            raise ConfigError(f"{where}.name: {self.name!r} must be one of peers' names "
                              f"{sorted(names)}")
        if not self.listen.startswith(("tcp://", "ipc://")):
            raise ConfigError(f"{where}.listen: expected a ZeroMQ endpoint, got {self.listen!r}")
        if (self.queue_bytes < 64 << 10 or self.window < 1 or self.resend_after <= 0
                or self.max_peer_hosts < 1):
            raise ConfigError(f"{where}: queue_bytes must be at least 64 KiB, window, "
                              "resend_after and max_peer_hosts positive")


def _z85_ok(key: str) -> bool:
    try:
        return len(z85.decode(key.encode())) == 32
    except (ValueError, KeyError, TypeError):
        return False


def owner(job: str, peers: Iterable[str]) -> str:
    """The aggregator that diagnoses `job`: rendezvous hashing, the peer with the highest
    hash of (peer, job). The one definition; a stable function of the job and the peer names."""
    return max(sorted(peers),
               key=lambda p: hashlib.blake2b(f"{p}\0{job}".encode(), digest_size=8).digest())


def job_key(summary: dict[str, Any]) -> str:
    """A comm summary's job as diagnosis names it (model.Comm): its job id, else its comm."""
    return summary.get("job") or f"comm-{summary['comm']}"


class PeerKeys:
    """The peers' keys in the shape ZapHandler reads (EnrolledKeys'): key -> peer name."""

    def __init__(self, by_key: dict[bytes, str]) -> None:
        self.by_key = by_key

    def refresh(self) -> None:
        pass  # from the config: a change is a restart

    def host_for(self, key: bytes) -> str | None:
        return self.by_key.get(key)

    def __len__(self) -> int:
        return len(self.by_key)


class Link:
    """Frames for one peer (its jobs' sections), in order, until it acks them."""

    def __init__(self, peer: Peer, sock: zmq.Socket[Any], cfg: FederationConfig) -> None:
        self.peer = peer
        self.sock = sock
        self.cfg = cfg
        self.queue: deque[tuple[int, bytes]] = deque()  # (fseq, frame bytes), oldest first
        self.bytes = 0
        self.next_fseq = 1
        self.sent = 0  # frames of the queue's head already sent (in flight)
        self.progress = 0.0  # when an ack last moved (or the first send after a quiet spell)
        self.forwarded = 0
        self.acked = 0
        self.dropped = 0
        self.resent = 0

    def put(self, data: bytes) -> None:
        self.queue.append((self.next_fseq, data))
        self.next_fseq += 1
        self.bytes += len(data)
        self.forwarded += 1
        while self.bytes > self.cfg.queue_bytes and len(self.queue) > 1:
            _, old = self.queue.popleft()  # the oldest goes: the owner counts it via `floor`
            self.bytes -= len(old)
            self.dropped += 1
            self.sent = max(0, self.sent - 1)

    def on_ack(self, fseq: int, now: float) -> None:
        moved = False
        while self.queue and self.queue[0][0] <= fseq:
            _, data = self.queue.popleft()
            self.bytes -= len(data)
            self.sent = max(0, self.sent - 1)
            self.acked += 1
            moved = True
        if moved:
            self.progress = now

    def pump(self, me: str, boot: str, now: float) -> None:
        if self.sent and now - self.progress > self.cfg.resend_after:
            self.resent += self.sent  # go back N: the owner applies only the next fseq
            self.sent = 0
        if not self.sent:
            self.progress = now
        floor = self.queue[0][0] if self.queue else self.next_fseq
        while self.sent < min(len(self.queue), self.cfg.window):
            fseq, data = self.queue[self.sent]
            head = msgpack.packb({"from": me, "boot": boot, "fseq": fseq, "floor": floor})
            try:
                self.sock.send_multipart([head, data], zmq.NOBLOCK)
            except zmq.Again:  # not connected (IMMEDIATE) or its pipe is full: later
                return
            self.sent += 1

    def stats(self) -> dict[str, int]:
        return {"queued": len(self.queue), "queued_bytes": self.bytes, "in_flight": self.sent,
                "forwarded": self.forwarded, "acked": self.acked, "dropped": self.dropped,
                "resent": self.resent}


@dataclass
class Inbound:
    """What this aggregator applied of one peer's stream."""
    boot: str
    applied: int  # every fseq up to this one is applied (or rejected, or lost)
    lost: int = 0
    heard: float = 0.0  # time.monotonic() of its last forward: a silent peer shows


class Federation:
    """Both ends of forwarding for one aggregator. Called from the server's loop thread: `local`
    from ingest after a commit (under Server.lock), `pump` and `receive` from the loop."""

    def __init__(self, cfg: FederationConfig, boot: str, keys: tuple[bytes, bytes] | None,
                 max_frame: int, prepare: Callable[[bytes], Frame | Exception],
                 registry: HostRegistry, log: logging.Logger | None = None,
                 host_expire_s: float = 3600.0) -> None:
        self.cfg = cfg
        self.me = cfg.name
        self.boot = boot
        self.names = sorted(p.name for p in cfg.peers)
        self.prepare = prepare  # Ingest.prepare: the same decoding and checks as any frame
        self.registry = registry  # each host's latest hello (stored: it outlives a restart)
        self.log = log or logging.getLogger("c4.aggregator.federation")
        self._owner_of: OrderedDict[str, str] = OrderedDict()  # job -> owner
        self._comm_owner: OrderedDict[str, str] = OrderedDict()  # comm -> owner (events)
        self._hosts: dict[str, dict[str, float]] = {}  # host -> owner -> last forward
        self.rejected: Counter[str] = Counter()
        self.received = 0
        self.duplicates = 0
        self.inbound: dict[str, Inbound] = {}
        # peer -> host names its accepted forwards named -> when last (monotonic), oldest
        # first: per peer name, not per boot, so a restart frees no places
        self.named: dict[str, OrderedDict[str, float]] = {}
        self.host_expire_s = host_expire_s  # diagnosis forgets a host silent this long
        self.zctx = zmq.Context()
        self.zap: ZapHandler | None = None
        if keys is not None:
            missing = [p.name for p in cfg.peers if not p.public_key]
            if missing:
                raise ConfigError(f"federation.peers: {', '.join(missing)}: public_key is "
                                  "required unless insecure = true")
            peer_keys = {p.public_key.encode(): p.name for p in cfg.peers if p.name != self.me}
            self.zap = ZapHandler(self.zctx, PeerKeys(peer_keys), self.log)  # type: ignore[arg-type]
        self.sock = self.zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 2 * max_frame)
        # Unread forwards per connection by bytes, as the sender bounds its queue (ZeroMQ's
        # default, 1,000 messages of up to 2 * max_frame, is 2 GiB); then TCP pushes back.
        self.sock.setsockopt(zmq.RCVHWM, max(8, cfg.queue_bytes // max_frame))
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        if keys is not None:
            curve_server(self.sock, *keys)
        self.sock.bind(cfg.listen)
        self.links: dict[str, Link] = {}
        for p in cfg.peers:
            if p.name == self.me:
                continue
            s = self.zctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.IMMEDIATE, 1)  # nothing queues in ZeroMQ for a peer that is down
            s.setsockopt(zmq.SNDHWM, cfg.window)
            s.setsockopt(zmq.HEARTBEAT_IVL, 2000)
            s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
            if keys is not None:
                s.curve_serverkey = p.public_key.encode()
                s.curve_publickey, s.curve_secretkey = keys
            s.connect(p.endpoint)
            self.links[p.name] = Link(p, s, cfg)

    def sockets(self) -> list[zmq.Socket[Any]]:
        return [self.sock] + [lk.sock for lk in self.links.values()]

    # -- pod side: what stays, what goes ----------------------------------------------------
    def owner(self, job: str) -> str:
        o = self._owner_of.get(job)
        if o is None:
            o = self._owner_of[job] = owner(job, self.names)
            if len(self._owner_of) > JOBS_CACHED:
                self._owner_of.popitem(last=False)
        return o

    def local(self, frame: Frame, now: float) -> Frame | None:
        """The part of a committed frame this aggregator diagnoses (None: nothing); the rest
        is queued for its owners."""
        if frame.kind == "hello":
            for o in self._hosts.get(frame.host, {}):
                self.links[o].put(self._encode(frame))
            return frame
        if frame.kind == "event":
            if frame.body.get("type") != "nccl_stall":
                return frame
            o = self._comm_owner.get(frame.body["attrs"].get("comm"), self.me)
            if o == self.me:
                return frame
            self.links[o].put(self._encode(frame))
            return None
        if frame.kind != "report":
            return frame
        nccl = frame.body.get("nccl")
        sticky = self._hosts.get(frame.host) or {}
        if not nccl and not sticky:
            return frame
        mine: list[dict[str, Any]] = []
        theirs: dict[str, list[dict[str, Any]]] = {o: [] for o, t in sticky.items()
                                                   if now - t <= STICKY_S}
        for s in (nccl or {}).get("comms", []):
            o = self.owner(job_key(s))
            self._comm_owner[s["comm"]] = o
            self._comm_owner.move_to_end(s["comm"])
            if o == self.me:
                mine.append(s)
            else:
                theirs.setdefault(o, []).append(s)
        while len(self._comm_owner) > JOBS_CACHED:
            self._comm_owner.popitem(last=False)
        seen = self._hosts.setdefault(frame.host, {})
        for o, comms in theirs.items():
            if o not in seen:  # the owner's first from this host: its NICs (hello)
                self._put_hello(o, frame.host, now)
            if comms:
                seen[o] = now
            body = {"interval": frame.body["interval"], "health": {}, "nccl": {"comms": comms}}
            self.links[o].put(self._encode(Frame("report", frame.host, frame.boot, frame.seq,
                                                 frame.ts, body, frame.version)))
        for o in [o for o in seen if now - seen[o] > STICKY_S]:
            del seen[o]
        if not seen:
            self._hosts.pop(frame.host, None)
        if not nccl or len(mine) == len(nccl.get("comms", [])):
            return frame
        return Frame(frame.kind, frame.host, frame.boot, frame.seq, frame.ts,
                     {**frame.body, "nccl": {**nccl, "comms": mine}}, frame.version, frame.floor)

    def _put_hello(self, peer: str, host: str, now: float) -> None:
        h = self.registry.hosts.get(host)
        if h is not None and h.hello:
            self.links[peer].put(self._encode(Frame("hello", host, h.boot, 1, now, h.hello)))

    @staticmethod
    def _encode(frame: Frame) -> bytes:
        # validated when it arrived here (a subset of it); the owner validates it again
        return wire.encode(Frame(frame.kind, frame.host, frame.boot, frame.seq, frame.ts,
                                 frame.body, frame.version), validate=False)

    def pump(self, now: float) -> None:
        """Read the owners' acks and send what is due."""
        for lk in self.links.values():
            while True:
                try:
                    msg = lk.sock.recv(zmq.NOBLOCK)
                except zmq.Again:
                    break
                try:
                    ack = msgpack.unpackb(msg, raw=False)
                    if ack.get("boot") == self.boot and isinstance(ack.get("fseq"), int):
                        lk.on_ack(ack["fseq"], now)
                except Exception:  # a peer's bad ack costs that ack
                    self.rejected["malformed"] += 1
            lk.pump(self.me, self.boot, now)

    # -- owner side -----------------------------------------------------------------------
    def receive(self, apply: Callable[[list[Frame]], None]) -> None:
        """Take the peers' forward frames waiting: apply the next ones of each stream in
        order (`apply` runs them through diagnosis under the lock), then ack them."""
        good: list[Frame] = []
        acks: dict[bytes, tuple[str, int]] = {}
        for _ in range(DRAIN_FRAMES):
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            rid = parts[0].bytes
            who = str(parts[-1].get("User-Id")) if self.zap is not None else None
            try:
                sender, st, fseq, data = self._stream(parts, who)
            except Rejected as exc:
                self._reject(exc)
                continue
            if fseq <= st.applied:
                self.duplicates += 1
            elif fseq == st.applied + 1:
                st.applied = fseq
                try:
                    good.append(self._admit(sender, self._check(self.prepare(data))))
                    self.received += 1
                except Rejected as exc:  # consumed: a bad frame must not stall the stream
                    self._reject(exc)
            # else a gap: the sender goes back and resends from it
            acks[rid] = (st.boot, st.applied)
        if good:
            apply(good)
        for rid, (boot, fseq) in acks.items():
            try:
                self.sock.send_multipart([rid, msgpack.packb({"boot": boot, "fseq": fseq})],
                                         zmq.NOBLOCK)
            except zmq.ZMQError:
                pass  # the peer resends and is acked again

    def _stream(self, parts: list[Any], who: str | None) -> tuple[str, Inbound, int, bytes]:
        if len(parts) != 3:
            raise Rejected("malformed", f"{len(parts) - 1} parts, expected header and frame")
        try:
            head = msgpack.unpackb(parts[1].bytes, raw=False, max_str_len=256, max_map_len=8,
                                   max_array_len=0, max_bin_len=0, max_ext_len=0)
            sender, boot, fseq, floor = head["from"], head["boot"], head["fseq"], head["floor"]
            # type(x) is int: a boolean is no sequence number (it passed isinstance and 1 <= True)
            if not (isinstance(sender, str) and type(fseq) is int and type(floor) is int
                    and 0 < floor <= fseq < 1 << 62 and len(head) == 4):
                raise ValueError("header fields")
            IDENT.check(boot)
        except Exception as exc:
            raise Rejected("malformed", f"bad forward header: {type(exc).__name__}") from None
        if sender not in self.names or sender == self.me or (who is not None and
                                                             self._key_of(sender) != who):
            raise Rejected("identity", f"forward names peer {sender!r} "
                           f"but comes from {who or 'an unknown peer'}")
        st = self.inbound.get(sender)
        if st is None or st.boot != boot:  # a new incarnation: take its stream from here
            st = self.inbound[sender] = Inbound(boot, floor - 1)
        st.heard = time.monotonic()
        if floor - 1 > st.applied:  # dropped from its full queue: lost, not awaited
            st.lost += floor - 1 - st.applied
            st.applied = floor - 1
        return sender, st, fseq, parts[2].bytes

    def _key_of(self, name: str) -> str | None:
        for p in self.cfg.peers:
            if p.name == name:
                return p.public_key
        return None

    def _check(self, prepared: Frame | Exception) -> Frame:
        if isinstance(prepared, Rejected):
            raise Rejected("bad_frame", str(prepared), prepared.frame)
        if not isinstance(prepared, Frame):
            raise Rejected("bad_frame", f"cannot decode: {type(prepared).__name__}")
        f = prepared
        if f.kind == "report":
            extra = set(f.body) - {"interval", "health", "nccl"}
            if extra or f.body.get("health"):
                raise Rejected("unexpected_section", f"a forward carries the nccl section only, "
                               f"not {sorted(extra) or ['health']}", f.to_dict())
            for s in (f.body.get("nccl") or {}).get("comms", []):
                if self.owner(job_key(s)) != self.me:
                    raise Rejected("not_owner", f"job {job_key(s)!r} is owned by "
                                   f"{self.owner(job_key(s))!r}, not {self.me!r}", f.to_dict())
        elif f.kind == "event":
            if f.body.get("type") != "nccl_stall":
                raise Rejected("unexpected_kind", f"a forwarded event is nccl_stall only, not "
                               f"{f.body.get('type')!r}", f.to_dict())
        elif f.kind != "hello":
            raise Rejected("unexpected_kind", f"{f.kind!r} is not forwarded", f.to_dict())
        return f

    def _admit(self, sender: str, f: Frame) -> Frame:
        """A forward naming a host its peer has not named lately takes one of the peer's
        `max_peer_hosts` places; names silent for `host_expire_s` free theirs first."""
        named = self.named.setdefault(sender, OrderedDict())
        now = time.monotonic()
        if f.host in named:
            named.move_to_end(f.host)
        else:
            while named and now - next(iter(named.values())) > self.host_expire_s:
                named.popitem(last=False)
            if len(named) >= self.cfg.max_peer_hosts:
                raise Rejected("too_many_hosts", f"peer {sender!r} already names "
                               f"{len(named)} hosts (max_peer_hosts); not {f.host!r}")
        named[f.host] = now
        return f

    def _reject(self, exc: Rejected) -> None:
        code = exc.code if exc.code in FORWARD_REJECTS else "bad_frame"
        self.rejected[code] += 1
        if self.rejected[code] == 1 or self.rejected[code] % 1000 == 0:
            self.log.warning("rejected a forward frame (%d so far): %s", self.rejected[code], exc)

    # -- reading --------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "name": self.me, "peers": self.names,
            "out": {n: lk.stats() for n, lk in sorted(self.links.items())},
            "in": {"received": self.received, "duplicates": self.duplicates,
                   "lost": {n: s.lost for n, s in sorted(self.inbound.items())},
                   # seconds since each peer's last forward (None: none since this start)
                   "silent_s": {n: round(now - self.inbound[n].heard, 3)
                                if n in self.inbound else None
                                for n in self.names if n != self.me},
                   "rejected": {r: self.rejected.get(r, 0) for r in FORWARD_REJECTS},
                   "auth": self.zap.stats() if self.zap is not None else None},
        }

    def close(self) -> None:
        for lk in self.links.values():
            lk.sock.close(0)
        self.sock.close(0)
        if self.zap is not None:
            self.zap.close()
        self.zctx.term()
