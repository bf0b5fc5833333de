"""Path discovery: trace one fixed 5-tuple with rising TTL, Paris-traceroute style (docs/wire.md,
`probe`/`probe_result`; docs/planning.md).

ECMP routers hash the 5-tuple, so every packet of a trace must carry exactly the flow's tuple:
one socket bound to (src, sport) sends to (dst, dport) with IP_TTL 1, 2, ...; the router where the
TTL runs out answers ICMP time-exceeded, which the kernel queues on that socket's error queue
(IP_RECVERR) with the router's address as the offender. No raw socket, no privilege.

- `roce`: UDP datagrams to dport 4791, hashed like the RoCEv2 packets of a QP with that UDP
  source port. The destination answers port-unreachable (a Linux host without rxe) or nothing
  (a RoCE NIC consumes 4791 itself).
- `tcp`: TCP SYNs from a socket bound to sport. A SYN that reached the destination would open a
  connection to the application's listening socket (gloo, NCCL bootstrap), so TCP is traced only
  up to the last router: the destination's distance is learned first with a UDP datagram to a
  closed port (every ECMP path of a leaf-spine fabric has the same length) and SYNs go out with
  TTL below it. Without a known distance a TCP trace is refused with an error.
- a live TCP connection's own 4-tuple (bind or connect says EADDRINUSE/EADDRNOTAVAIL): no second
  socket can own it, and its path is the one C4P must know to judge a plan's gain. Segments
  with that tuple are written on a raw socket (as paratrace does, parasitic on the
  connection) and the routers' time-exceeded read on a raw ICMP socket, matched by the quoted
  tuple and sequence number: this needs CAP_NET_RAW. They are bare ACKs whose sequence number
  is random, so the connection's own TCP ignores the time-exceeded that quotes them (outside
  its window: OutOfWindowIcmps) unless it falls in the bytes in flight (about 1 in 1,000 for
  4 MB in flight), where it is a soft error the connection reports only if it later times out
  (or at once to an application that set IP_RECVERR on it). Their TTL stays below the
  destination, as for SYNs.

Measuring (`measure` in a probe request, docs/diagnosis.md): C4D asks which of a path's links
loses or delays packets. The agent picks the first of the given ports whose hop at `ttl`
answers from one of `via` (the switch's addresses; any when none are given), then sends `count`
datagrams on that one 5-tuple with that TTL at a steady pace, each answered by that hop within
`answer_timeout` or lost: they cross the links up to it and the answers the links back,
nothing else. Sending does not wait for answers (a slow or lossy leg's round takes as long as
a clean one's); the answers are matched to their datagrams by the seq the router's quote
carries. It reports sent, answered and RTT percentiles. Routers generate these answers on
their CPU and police them (CoPP), so the rate is the same token bucket as traces, and an
answer policed away reads as a lost datagram: C4D compares legs, it never reads one leg's loss
alone.

The prober is synchronous; the agent runs it on worker threads (ProbeWorker) so a silent hop
never delays reports: traces on one, measuring requests on up to MEASURERS more, each leg at
its own pace, so a leg through a slow queue does not hold its host's other legs back (lab run
AB: one host's three legs in turn, the slow leg's rounds came 7-8 s apart and its verdict
waited for a third). Packets are rate limited (one token bucket for all traces and legs
together) and traces cached briefly so a repeated request costs nothing; the aggregator's path
map is the long-term store and decides when to ask again.
"""
from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import queue
import secrets
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

ROCE_DPORT = 4791
# A measurement's pace: a switch answers on its CPU under a policer (Linux: icmp_msgs_per_sec,
# 1000/s per router), and two legs usually stop at the same spine; faster, the policer's drops
# read as loss on both legs (the lab lost 3 % of answers at 500/s a leg).
MEASURE_PPS = 200.0
# ... and a round stops sending after this many times what `count` datagrams take at that pace
# (the token bucket shared with the host's other legs may hold it back), then waits for the
# answers still due. Datagrams go out at the pace without waiting for answers: waiting, a leg
# through a 38 ms queue kept the agent's prober busy 6-13 s a round (lab runs Y, AA), and one
# losing 10 % took 6 s, 0.1 s per lost datagram, so its rounds came 6-7 s apart and its
# verdict waited for a third (lab run AD)
MEASURE_STRETCH = 1.5
# legs measured at once: C4D's ties span 2-3 candidate links, each with its NIC's TTL-1 leg
# beside it; the shared token bucket keeps the total within `rate` whatever the count
MEASURERS = 4
DISTANCE_DPORT = 33434  # traceroute's first port: closed on ordinary hosts
MSG_ERRQUEUE = 0x2000
# what an ICMP answer to a datagram sets as its socket's pending error (port unreachable, time
# exceeded, other unreachables)
ANSWER_ERRNOS = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
MEASURE_MAGIC = b"c4ms"  # a measuring datagram's payload: this, then its seq (u32)
IP_RECVERR = 11
IPV6_RECVERR = 25
IPV6_HDRINCL = 36  # linux/in6.h; not in Python's socket module
SOL_RAW, ICMP_FILTER = 255, 1  # linux/icmp.h: a bitmask of the ICMP types to drop
ICMP6_FILTER = 1  # linux/icmpv6.h (level IPPROTO_ICMPV6): 256 bits, set = drop
TCP_ACK = 0x10
SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6 = 2, 3
# struct sock_extended_err, then the offender's sockaddr (SO_EE_OFFENDER)
EXT_ERR = struct.Struct("=IBBBBII")
# ICMP (type, code) meanings per family: time exceeded, destination unreachable (port)
TIME_EXCEEDED = {socket.AF_INET: 11, socket.AF_INET6: 3}
DEST_UNREACH = {socket.AF_INET: 3, socket.AF_INET6: 1}
PORT_UNREACH = {socket.AF_INET: 3, socket.AF_INET6: 4}

log = logging.getLogger("c4.agent.probe")


class ProbeError(Exception):
    """A 5-tuple that cannot be traced; `str()` is the reason sent to the aggregator."""


@dataclass
class Trace:
    proto: str
    src: str | None
    dst: str
    sport: int
    dport: int
    hops: list[str | None] = field(default_factory=list)
    reached: bool = False
    error: str | None = None

    def entry(self, probe_id: str) -> dict[str, Any]:
        """One `probe_result.results` entry."""
        out: dict[str, Any] = {"id": probe_id, "sport": self.sport, "hops": list(self.hops),
                               "reached": self.reached}
        if self.error:
            out["error"] = self.error[:512]
        return out


@dataclass
class Measurement:
    """What `count` datagrams on one fixed 5-tuple with one TTL saw."""
    sport: int
    hop: str | None = None  # who answered at the TTL (the first answer)
    sent: int = 0
    answered: int = 0
    rtts: list[float] = field(default_factory=list)  # seconds, of the answered ones
    error: str | None = None
    elsewhere: int = 0  # ports tried whose hop at the TTL answered, not from `via`

    def entry(self, probe_id: str, ttl: int) -> dict[str, Any]:
        """One `probe_result.results` entry: the hop at `ttl`, the counts, RTT percentiles."""
        out: dict[str, Any] = {"id": probe_id, "sport": self.sport,
                               "hops": [None] * (ttl - 1) + [self.hop], "reached": False,
                               "sent": self.sent, "answered": self.answered}
        if self.rtts:
            xs = sorted(self.rtts)
            out["rtt_us"] = [int(xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6)
                             for q in (0.5, 0.9, 0.99)]
        if self.error:
            out["error"] = self.error[:512]
        if self.elsewhere:
            out["elsewhere"] = self.elsewhere
        return out


@dataclass
class _Answer:
    kind: str  # "router" (time exceeded), "dest" (the destination answered), "unreach"
    addr: str
    icmp_type: int
    icmp_code: int


class TokenBucket:
    """`rate` packets per second, at most `burst` at once; take() sleeps until a token is there.
    Thread-safe: a taker reserves its token (the count goes below zero) and sleeps outside the
    lock for the time the reservation takes to fill."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate, self.burst, self.clock, self.sleep = rate, burst, clock, sleep
        self.tokens = burst
        self.at = clock()
        self._lock = threading.Lock()

    def take(self) -> None:
        wait = self.reserve()
        if wait > 0:
            self.sleep(wait)

    def reserve(self) -> float:
        """Takes a token now; returns the seconds until it may be used (0: at once)."""
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate) - 1
            self.at = now
            return max(0.0, -self.tokens / self.rate)


def _family(addr: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(addr).version == 6 else socket.AF_INET


def _ttl_option(family: int) -> tuple[int, int]:
    if family == socket.AF_INET6:
        return socket.IPPROTO_IPV6, socket.IPV6_UNICAST_HOPS
    return socket.IPPROTO_IP, socket.IP_TTL


def _read_errqueue(sock: socket.socket) -> _Answer | None:
    """One ICMP error from the socket's error queue, or None if it holds none."""
    try:
        _, ancdata, _, _ = sock.recvmsg(512, 512, MSG_ERRQUEUE)
    except BlockingIOError:
        return None
    return _parse_err(ancdata)


def _parse_err(ancdata: list[tuple[int, int, bytes]]) -> _Answer | None:
    """The ICMP error in a MSG_ERRQUEUE read's control messages, if any."""
    for level, kind, data in ancdata:
        if (level, kind) not in ((socket.IPPROTO_IP, IP_RECVERR),
                                 (socket.IPPROTO_IPV6, IPV6_RECVERR)):
            continue
        _errno, origin, icmp_type, code, _pad, _info, _data = EXT_ERR.unpack_from(data)
        if origin not in (SO_EE_ORIGIN_ICMP, SO_EE_ORIGIN_ICMP6):
            continue
        fam = struct.unpack_from("=H", data, EXT_ERR.size)[0]
        if fam == socket.AF_INET:
            addr = socket.inet_ntop(socket.AF_INET, data[EXT_ERR.size + 4:EXT_ERR.size + 8])
        elif fam == socket.AF_INET6:
            addr = socket.inet_ntop(socket.AF_INET6, data[EXT_ERR.size + 8:EXT_ERR.size + 24])
        else:
            continue
        family = socket.AF_INET if origin == SO_EE_ORIGIN_ICMP else socket.AF_INET6
        if icmp_type == TIME_EXCEEDED[family]:
            return _Answer("router", addr, icmp_type, code)
        if icmp_type == DEST_UNREACH[family] and code == PORT_UNREACH[family]:
            return _Answer("dest", addr, icmp_type, code)
        return _Answer("unreach", addr, icmp_type, code)
    return None


def _checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return int(~total & 0xFFFF)


def tcp_segment(src: str, dst: str, sport: int, dport: int, seq: int, ttl: int) -> bytes:
    """An IP packet (header included, for IPPROTO_RAW) carrying a bare TCP ACK with this
    4-tuple, sequence number and TTL (hop limit)."""
    family = _family(dst)
    a, b = socket.inet_pton(family, src), socket.inet_pton(family, dst)
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, TCP_ACK, 1024, 0, 0)
    if family == socket.AF_INET6:
        pseudo = a + b + struct.pack("!I3xB", len(tcp), socket.IPPROTO_TCP)
    else:
        pseudo = a + b + struct.pack("!xBH", socket.IPPROTO_TCP, len(tcp))
    tcp = tcp[:16] + struct.pack("!H", _checksum(pseudo + tcp)) + tcp[18:]
    if family == socket.AF_INET6:
        return struct.pack("!IHBB", 6 << 28, len(tcp), socket.IPPROTO_TCP, ttl) + a + b + tcp
    # the kernel fills in the header checksum and, left 0, the identification
    return struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(tcp), 0, 0x4000, ttl,
                       socket.IPPROTO_TCP, 0) + a + b + tcp


def parse_icmp_quote(family: socket.AddressFamily, data: bytes, sender: str
                     ) -> tuple[_Answer, tuple[str, str, int, int, int]] | None:
    """An ICMP error read on a raw ICMP socket (IPv4: with its IP header; IPv6: from the
    ICMPv6 header) and the TCP segment it quotes: (answer, (src, dst, sport, dport, seq)).
    None for any other message, or one quoting something else than TCP."""
    try:
        if family == socket.AF_INET:
            icmp = data[(data[0] & 0x0F) * 4:]
            inner = icmp[8:]
            ihl = (inner[0] & 0x0F) * 4
            if inner[9] != socket.IPPROTO_TCP:
                return None
            addrs, seg = (inner[12:16], inner[16:20]), inner[ihl:]
        else:
            icmp = data
            inner = icmp[8:]
            if inner[6] != socket.IPPROTO_TCP:
                return None
            addrs, seg = (inner[8:24], inner[24:40]), inner[40:]
        icmp_type, code = icmp[0], icmp[1]
        sport, dport, seq = struct.unpack_from("!HHI", seg)
    except (IndexError, struct.error):
        return None
    if icmp_type == TIME_EXCEEDED[family]:
        kind = "router"
    elif icmp_type == DEST_UNREACH[family]:
        kind = "unreach"
    else:
        return None
    quoted = (socket.inet_ntop(family, addrs[0]), socket.inet_ntop(family, addrs[1]),
              sport, dport, seq)
    return _Answer(kind, sender, icmp_type, code), quoted


def _icmp_socket(family: socket.AddressFamily) -> socket.socket:
    """A raw socket handed a copy of the host's ICMP errors (time exceeded, unreachable)."""
    if family == socket.AF_INET6:
        s = socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
        words = [0xFFFFFFFF] * 8  # struct icmp6_filter: bit t%32 of word t/32, set = drop
        for t in (TIME_EXCEEDED[family], DEST_UNREACH[family]):
            words[t >> 5] &= ~(1 << (t & 31)) & 0xFFFFFFFF
        s.setsockopt(socket.IPPROTO_ICMPV6, ICMP6_FILTER, struct.pack("=8I", *words))
    else:
        s = socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_ICMP)
        keep = (1 << TIME_EXCEEDED[family]) | (1 << DEST_UNREACH[family])
        s.setsockopt(SOL_RAW, ICMP_FILTER, struct.pack("=I", ~keep & 0xFFFFFFFF))
    s.setblocking(False)
    return s


def _source_for(family: socket.AddressFamily, dst: str) -> str:
    """The address the route to dst leaves from (no packet sent)."""
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((dst, 9))
        return str(s.getsockname()[0])


class Prober:
    """Traces and measures fixed 5-tuples. `trace` belongs to one thread (its caches are not
    locked); `measure` may run on several at once beside it."""

    def __init__(self, *, hop_timeout: float = 0.25, silent_limit: int = 3, rate: float = 500.0,
                 burst: float = 100.0, cache_ttl: float = 30.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.hop_timeout = hop_timeout
        self.silent_limit = silent_limit  # consecutive silent TTLs that end a trace
        self.bucket = TokenBucket(rate, burst, clock, sleep)
        self.cache_ttl = cache_ttl
        self.clock = clock
        self._cache: dict[tuple[Any, ...], tuple[float, Trace]] = {}
        self._distance: dict[tuple[str | None, str], tuple[float, int]] = {}
        self._lock = threading.Lock()
        self._measuring: set[tuple[str | None, int]] = set()  # (src, sport) of legs under way
        self.packets = 0

    # -- public ---------------------------------------------------------------------------
    def trace(self, proto: str, dst: str, sport: int, *, dport: int | None = None,
              src: str | None = None, max_ttl: int = 8) -> Trace:
        dport = ROCE_DPORT if dport is None and proto == "roce" else dport
        t = Trace(proto, src, dst, sport, dport or 0)
        if dport is None:
            t.error = "dport is required for tcp"
            return t
        key = (proto, src, dst, sport, dport, max_ttl)
        hit = self._cache.get(key)
        if hit and self.clock() - hit[0] < self.cache_ttl:
            return hit[1]
        try:
            if proto not in ("roce", "tcp"):
                raise ProbeError(f"unknown proto {proto!r}")
            try:
                routers: int | None = self.distance(src, dst) - 1
            except ProbeError:
                if proto == "tcp":
                    raise
                routers = None  # trace until the destination answers or the path goes silent
            ttls = max_ttl if routers is None else min(max_ttl, routers)
            if proto == "roce":
                self._trace_udp(t, ttls, known_end=routers is not None)
            else:
                self._trace_tcp(t, ttls)
            if routers is not None and t.error is None:
                # every router answered and the next hop is the destination: the path is known
                t.reached = t.reached or (len(t.hops) == routers and all(t.hops))
        except ProbeError as exc:
            t.error = str(exc)
        except OSError as exc:
            t.error = f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc.strerror or exc}"
        if t.error is None:
            self._cache[key] = (self.clock(), t)
        self._prune()
        return t

    def measure(self, dst: str, sports: list[int], *, ttl: int, count: int,
                via: tuple[str, ...] = (), src: str | None = None, dport: int = ROCE_DPORT,
                answer_timeout: float = 0.1, pps: float = MEASURE_PPS) -> Measurement:
        """`count` datagrams on the first of `sports` whose hop at `ttl` answers from `via`
        (any hop when empty; the destination itself when it is that close), `pps` a second,
        sending for at most MEASURE_STRETCH times what that pace takes (`sent` says how many
        went). A datagram whose answer does not come within `answer_timeout` is lost (a queue
        that long is as bad). A port another leg measures on at the same time is skipped: the
        kernel would queue one socket's answers on the other."""
        m = Measurement(sports[0] if sports else 0)
        family = _family(dst)
        level, opt = _ttl_option(family)
        try:
            for sport in sports:
                with self._leg_port(src, sport) as free:
                    if not free:
                        continue
                    m.sport = sport
                    with self._udp_socket(family, src, sport) as s:
                        s.setsockopt(level, opt, ttl)
                        first = self._ping(s, dst, dport, 0, answer_timeout)
                        if first is None or (via and first[0] not in via):
                            m.elsewhere += first is not None
                            continue  # another path, or silence: the next port
                        m.hop = first[0]
                        self._round(s, m, dst, dport, count, pps, answer_timeout)
                        return m
            m.error = f"no port of {len(sports)} reached {'/'.join(via) or 'a hop'} at TTL {ttl}"
        except OSError as exc:
            m.error = f"{errno.errorcode.get(exc.errno or 0, 'OSError')}: {exc.strerror or exc}"
        return m

    def _round(self, s: socket.socket, m: Measurement, dst: str, dport: int, count: int,
               pps: float, timeout: float) -> None:
        """Sends at the pace without waiting for answers; each answer is matched to its
        datagram by the seq its quote carries (to the oldest one waiting when the router
        quoted too little: answers come back in order), its RTT from when it was read."""
        waiting: dict[int, float] = {}  # seq -> when sent, oldest first
        seq, due = 0, self.clock()
        stop = due + MEASURE_STRETCH * count / pps
        token_at: float | None = None  # when the reserved token of the next datagram is due
        while True:
            now = self.clock()
            for q in [q for q, at in waiting.items() if at + timeout <= now]:
                del waiting[q]  # lost
            sending = seq < count and now < stop
            if not sending and not waiting:
                return
            if sending and now >= due and token_at is None:
                token_at = now + self.bucket.reserve()
            send_at = (due if token_at is None else token_at) if sending else None
            wake = min([at + timeout for at in waiting.values()][:1] +
                       ([send_at] if send_at is not None else []))
            # read what came before sending: a queued error fails the next send
            for heard, addr in self._heard(s, max(0.0, wake - now)):
                key = heard if heard is not None else next(iter(waiting), None)
                sent_at = waiting.pop(key, None) if key is not None else None
                if sent_at is not None and addr == m.hop:
                    m.answered += 1
                    m.rtts.append(self.clock() - sent_at)
            if send_at is not None and token_at is not None and self.clock() >= send_at:
                seq += 1
                self._send(s, dst, dport, seq)
                waiting[seq] = self.clock()
                m.sent += 1
                due, token_at = max(due + 1 / pps, now - 1 / pps), None

    def _send(self, s: socket.socket, dst: str, dport: int, seq: int) -> None:
        data = MEASURE_MAGIC + struct.pack("!I", seq)
        try:
            s.sendto(data, (dst, dport))
        except OSError as exc:
            # an answer that came since the last read set the socket's pending error, which
            # this send reported (and cleared) instead of sending; the answer stays queued
            if exc.errno not in ANSWER_ERRNOS:
                raise
            s.sendto(data, (dst, dport))
        with self._lock:
            self.packets += 1

    def _heard(self, s: socket.socket, timeout: float) -> list[tuple[int | None, str]]:
        """Answers on a measuring socket within `timeout`: (the seq the router's quote
        carries, None when it quoted too little; who answered)."""
        poller = select.poll()
        poller.register(s, select.POLLERR | select.POLLIN)
        if not poller.poll(timeout * 1000):
            return []
        out: list[tuple[int | None, str]] = []
        while True:
            try:
                data, ancdata, _, _ = s.recvmsg(64, 512, MSG_ERRQUEUE)
            except BlockingIOError:
                try:
                    s.recv(64)  # a datagram nobody asked for
                except OSError:
                    pass
                return out
            answer = _parse_err(ancdata)
            if answer is None or answer.kind == "unreach":
                continue
            if len(data) >= 8:
                if data[:4] != MEASURE_MAGIC:
                    continue
                out.append((struct.unpack_from("!I", data, 4)[0], answer.addr))
            else:
                out.append((None, answer.addr))

    @contextlib.contextmanager
    def _leg_port(self, src: str | None, sport: int) -> Iterator[bool]:
        """Holds (src, sport) for one leg while it measures; yields False if another has it."""
        key = (src, sport)
        with self._lock:
            free = key not in self._measuring
            self._measuring.add(key)
        try:
            yield free
        finally:
            if free:
                with self._lock:
                    self._measuring.discard(key)

    def _ping(self, s: socket.socket, dst: str, dport: int, seq: int,
              timeout: float) -> tuple[str, float] | None:
        """One datagram; (who answered, RTT) or None. Answers to earlier datagrams (their
        payload names their seq where the router quotes it) are skipped."""
        self.bucket.take()
        payload = MEASURE_MAGIC + struct.pack("!I", seq)
        poller = select.poll()
        poller.register(s, select.POLLERR | select.POLLIN)
        t0 = self.clock()
        s.sendto(payload, (dst, dport))
        with self._lock:
            self.packets += 1
        while True:
            left = t0 + timeout - self.clock()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            try:
                data, ancdata, _, _ = s.recvmsg(64, 512, MSG_ERRQUEUE)
            except BlockingIOError:
                try:
                    s.recv(64)  # a datagram nobody asked for
                except OSError:
                    pass
                continue
            answer = _parse_err(ancdata)
            if answer is None or answer.kind == "unreach" or \
                    (len(data) >= len(payload) and data[:len(payload)] != payload):
                continue
            return answer.addr, self.clock() - t0

    # -- UDP (RoCEv2) ---------------------------------------------------------------------
    def _udp_socket(self, family: int, src: str | None, sport: int) -> socket.socket:
        s = socket.socket(family, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
            else:
                s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            s.bind((src or "", sport))
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        return s

    def _trace_udp(self, t: Trace, max_ttl: int, *, known_end: bool = False) -> None:
        family = _family(t.dst)
        level, opt = _ttl_option(family)
        with self._udp_socket(family, t.src, t.sport) as s:
            self._walk(t, max_ttl, lambda ttl: self._udp_send(s, level, opt, ttl, t),
                       lambda ttl: self._wait(s), known_end=known_end)

    def _udp_send(self, s: socket.socket, level: int, opt: int, ttl: int, t: Trace) -> None:
        s.setsockopt(level, opt, ttl)
        # The payload names the TTL so a late answer for an earlier TTL is recognisable.
        s.sendto(struct.pack("!4sH", b"c4pr", ttl), (t.dst, t.dport))

    def distance(self, src: str | None, dst: str) -> int:
        """Hops to dst (routers + 1), learned once per cache period with a UDP datagram to a
        closed port from an ephemeral port: every ECMP path of a leaf-spine fabric has the same
        length. Silent TTLs just before the destination's answer are counted as the destination
        (hosts rate-limit port-unreachable), so the distance errs short, never long: a TCP trace
        then misses the last router rather than sending a SYN to the application."""
        hit = self._distance.get((src, dst))
        if hit and self.clock() - hit[0] < self.cache_ttl:
            return hit[1]
        t = Trace("roce", src, dst, 0, DISTANCE_DPORT)
        self._trace_udp(t, 32)
        if not t.reached:
            raise ProbeError(f"distance to {dst} unknown: no port-unreachable from it for a UDP "
                             f"datagram to port {DISTANCE_DPORT}; TCP probes are not sent, a SYN "
                             f"reaching the destination would open a connection to the "
                             f"application")
        while t.hops and t.hops[-1] is None:
            t.hops.pop()
        self._distance[(src, dst)] = (self.clock(), len(t.hops) + 1)
        return len(t.hops) + 1

    # -- TCP ------------------------------------------------------------------------------
    def _trace_tcp(self, t: Trace, max_ttl: int) -> None:
        try:
            self._trace_syn(t, max_ttl)
        except OSError as exc:
            # bind (EADDRINUSE) or connect (EADDRNOTAVAIL) refused the first SYN's socket:
            # the 4-tuple is a live connection's, nothing was sent
            if exc.errno not in (errno.EADDRINUSE, errno.EADDRNOTAVAIL) or t.hops:
                raise
            self._trace_live(t, max_ttl)

    def _trace_syn(self, t: Trace, max_ttl: int) -> None:
        family = _family(t.dst)
        level, opt = _ttl_option(family)
        holder: list[socket.socket] = []

        def send(ttl: int) -> None:
            for old in holder:
                old.close()
            holder.clear()
            s = socket.socket(family, socket.SOCK_STREAM)
            holder.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVERR, 1)
            else:
                s.setsockopt(socket.IPPROTO_IP, IP_RECVERR, 1)
            s.setsockopt(level, opt, ttl)
            # RST on close, never a FIN handshake or TIME_WAIT holding the port
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.setblocking(False)
            s.bind((t.src or "", t.sport))
            try:
                s.connect((t.dst, t.dport))
            except BlockingIOError:
                pass

        try:
            self._walk(t, max_ttl, send, lambda ttl: self._wait(holder[0]), known_end=True)
        finally:
            for s in holder:
                s.close()

    def _trace_live(self, t: Trace, max_ttl: int) -> None:
        """A live connection's own 4-tuple, on raw sockets (the module's docstring)."""
        family = _family(t.dst)
        src = t.src or _source_for(family, t.dst)
        try:
            # IPPROTO_RAW sends only: a raw TCP socket would also be handed a copy of every
            # TCP segment the host receives (the training job's traffic)
            out = socket.socket(family, socket.SOCK_RAW, socket.IPPROTO_RAW)
        except PermissionError as exc:
            raise ProbeError(f"source port {t.sport} is a live connection's: tracing its own "
                             f"4-tuple needs CAP_NET_RAW (raw sockets)") from exc
        with out, _icmp_socket(family) as icmp:
            if family == socket.AF_INET6:
                out.setsockopt(socket.IPPROTO_IPV6, IPV6_HDRINCL, 1)
            base = secrets.randbits(32)

            def send(ttl: int) -> None:
                seg = tcp_segment(src, t.dst, t.sport, t.dport, (base + ttl) & 0xFFFFFFFF, ttl)
                out.sendto(seg, (t.dst, 0))

            def wait(ttl: int) -> _Answer | None:
                want = (src, t.dst, t.sport, t.dport, (base + ttl) & 0xFFFFFFFF)
                return self._wait_icmp(icmp, family, want)

            self._walk(t, max_ttl, send, wait, known_end=True)

    def _wait_icmp(self, s: socket.socket, family: socket.AddressFamily,
                   want: tuple[str, str, int, int, int]) -> _Answer | None:
        """The ICMP error quoting the segment `want` (src, dst, sport, dport, seq), within the
        hop timeout; every other ICMP message the host receives is skipped."""
        deadline = self.clock() + self.hop_timeout
        poller = select.poll()
        poller.register(s, select.POLLIN)
        while True:
            left = deadline - self.clock()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            try:
                data, addr = s.recvfrom(2048)
            except BlockingIOError:
                continue
            got = parse_icmp_quote(family, data, addr[0])
            if got is not None and got[1] == want:
                return got[0]

    # -- common ---------------------------------------------------------------------------
    def _walk(self, t: Trace, max_ttl: int, send: Callable[[int], None],
              wait: Callable[[int], _Answer | None], *, known_end: bool = False) -> None:
        """TTL 1..max_ttl until the destination answers. With `known_end` (max_ttl is the last
        router) silent hops keep their place; otherwise trailing silence is dropped."""
        silent = 0
        for ttl in range(1, max_ttl + 1):
            self.bucket.take()
            send(ttl)
            with self._lock:
                self.packets += 1
            answer = wait(ttl)
            if answer is None:
                t.hops.append(None)
                silent += 1
                if silent >= self.silent_limit and not known_end:
                    break
                continue
            silent = 0
            if answer.kind == "router":
                t.hops.append(answer.addr)
                continue
            if answer.kind == "dest":
                t.reached = True
            else:
                t.error = (f"ICMP unreachable type {answer.icmp_type} code {answer.icmp_code} "
                           f"from {answer.addr} at TTL {ttl}")
            break
        while not known_end and t.hops and t.hops[-1] is None and not t.reached:
            t.hops.pop()  # trailing silence says nothing about the path

    def _wait(self, s: socket.socket) -> _Answer | None:
        deadline = self.clock() + self.hop_timeout
        stream = s.type == socket.SOCK_STREAM
        poller = select.poll()
        poller.register(s, select.POLLERR | select.POLLIN | (select.POLLOUT if stream else 0))
        while True:
            left = deadline - self.clock()
            if left <= 0 or not poller.poll(left * 1000):
                return None
            answer = _read_errqueue(s)
            if answer is not None:
                return answer
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if stream:
                # No ICMP: the SYN reached the destination (RST or SYN-ACK; closing the
                # socket sends RST), or the socket died for another reason.
                if err in (0, errno.ECONNREFUSED):
                    return _Answer("dest", "", 0, 0)
                raise OSError(err, f"{errno.errorcode.get(err, err)} while probing")
            try:
                s.recv(64)  # a datagram nobody asked for
            except OSError:
                pass

    def _prune(self) -> None:
        now = self.clock()
        for k in [k for k, (at, _) in self._cache.items() if now - at >= self.cache_ttl]:
            del self._cache[k]


class ProbeWorker:
    """Runs `probe` requests on threads: traces on one, measuring requests on up to
    `measurers` (each leg at its own pace); the agent's loop sends what `results()` returns."""

    def __init__(self, prober: Prober, *, max_pending: int = 16,
                 measurers: int = MEASURERS) -> None:
        self.prober = prober
        self._requests: queue.Queue[dict[str, Any]] = queue.Queue(max_pending)
        self._measures: queue.Queue[dict[str, Any]] = queue.Queue(max_pending)
        self._done: queue.Queue[dict[str, Any]] = queue.Queue()
        self._busy = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(self._requests,),
                                          name="c4-prober", daemon=True)]
        self._threads += [threading.Thread(target=self._run, args=(self._measures,),
                                           name=f"c4-measure-{i}", daemon=True)
                          for i in range(measurers)]
        for t in self._threads:
            t.start()

    def submit(self, body: dict[str, Any]) -> None:
        """Queue a validated `probe` body; a full queue answers at once with errors."""
        with self._lock:
            self._busy += 1
        measuring = all("measure" in p for p in body["probes"])
        try:
            (self._measures if measuring else self._requests).put_nowait(body)
        except queue.Full:
            self._finish(refuse(body, "rate limited: too many probe requests queued"))

    def pending(self) -> bool:
        with self._lock:
            return self._busy > 0

    def results(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        for q in (self._requests, self._measures):
            while True:  # what is still queued goes unanswered: the agent is stopping
                try:
                    q.get_nowait()
                except queue.Empty:
                    break
        self._requests.put({})  # an empty body stops the thread that takes it
        for _ in self._threads[1:]:
            self._measures.put({})
        for t in self._threads:
            t.join(timeout=5)

    def _finish(self, result: dict[str, Any]) -> None:
        self._done.put(result)
        with self._lock:
            self._busy -= 1

    def _run(self, requests: queue.Queue[dict[str, Any]]) -> None:
        while True:
            body = requests.get()
            if not body:
                return
            try:
                self._finish(run_probe(self.prober, body))
            except Exception as exc:  # a bug must not kill the thread or leave a request unanswered
                log.exception("probe %s failed", body.get("probe_id"))
                self._finish(refuse(body, f"agent error: {type(exc).__name__}: {exc}"))


def run_probe(prober: Prober, body: dict[str, Any]) -> dict[str, Any]:
    """`probe` body -> `probe_result` body."""
    results = []
    for p in body["probes"]:
        if "measure" in p:
            ms = p["measure"]
            m = prober.measure(p["dst"], p["sports"], ttl=ms["ttl"], count=ms["count"],
                               via=tuple(ms.get("via") or ()), src=p.get("src"),
                               dport=p.get("dport", ROCE_DPORT))
            results.append(m.entry(p["id"], ms["ttl"]))
            continue
        for sport in p["sports"]:
            t = prober.trace(p["proto"], p["dst"], sport, dport=p.get("dport"),
                             src=p.get("src"), max_ttl=p.get("max_ttl", 8))
            results.append(t.entry(p["id"]))
    return {"probe_id": body["probe_id"], "results": results}


def refuse(body: dict[str, Any], reason: str) -> dict[str, Any]:
    return {"probe_id": body["probe_id"], "results": [
        {"id": p["id"], "sport": s, "hops": [], "reached": False, "error": reason}
        for p in body["probes"] for s in p["sports"]]}
