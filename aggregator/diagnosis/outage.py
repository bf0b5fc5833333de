"""Fabric links that blackhole traffic for seconds (down before the fabric routes around it,
or each down phase of a flapping link), named before any collective stalls past the hang
threshold and although the job recovers between outages.

What an outage leaves on the hosts (measured on the lab's fabric, docs/lab.md):
- the senders' retransmission timers fire: the NICs of the hosts whose connections cross the
  link count ACK timeouts in the report after each outage: RoCE's in the NIC
  (`local_ack_timeout_err`), TCP's per connection in the kernel (eBPF tcp_flows `rto`, set
  against the NIC its source address is on). A lossless fabric, a hung rank, a straggler or a
  CPU hiccup cause none;
- sometimes (when no other channel keeps the communicator progressing for `C4_STALL_MS`) a
  stall message, whose connections in SendWait are the stuck ones.
Three kinds of observation vote together (localise.rank), each through the components of the
connections it covers:
- a sending NIC: bad when it counted ACK timeouts in `MIN_BEATS` reports of the last
  `WINDOW_S` seconds as one counter saw them (its RoCE counter, or its TCP flows' RTOs: one
  timeout both saw is once), or once within `PAIR_S` of a NIC that did (once, alone, may be
  one lost tail), clear when it sent data and counted none, neither in between; it covers
  every connection it sent in the window. Ring traffic makes
  the two ends of a path cover the same NICs (a leaf's hosts send up the link that the next
  leaf's hosts receive by), so NICs alone often tie between two links;
- a stuck connection: in SendWait in a stall message while its sender's NIC counted an ACK
  timeout within `PAIR_S` (a starved receiver leaves its senders in SendWait without
  timeouts); it covers its own path and so separates such ties;
- a TCP flow (the agents' eBPF `tcp_flows`: a TCP job, or the lab's ring): bad when it
  retransmitted in `MIN_BEATS` reports of the window each within `PAIR_S` of an ACK timeout
  of its own sending host (retransmits away from every timeout are congestion drops; at
  other hosts' timeouts only, a bystander's), in more than half as many
  reports as its host's most persistent flow and more than a quarter as many as any flow's
  (every flow through a blackholing link retransmits at each of its outages; one that did
  once or twice as the ring stalled and resumed is a bystander, neither bad nor clear: it
  alone would break a tie between the two ends of the same paths), clear when it moved data
  with none; it covers its own path (the path map's for its source port). Only bulk senders
  count.
  Which way a stuck connection or a bad flow lost traffic shows once both its ends stalled
  (a receiver holding data its sender never saw acknowledged lost the acks), or while it still
  moves, by which end dropped duplicates (the receiver: the acks were lost) (`_which_way`);
  such an observation covers the path its acks take (its receiver's socket: C4P traces every
  reported socket's 5-tuple) instead of its data's. A flap's down phases stall the ring too
  briefly for stall messages, but every flow whose path crosses the link retransmits in each
  phase (measured on the lab: docs/lab.md).
A fabric link is named when it explains bad observations of `MIN_HOSTS` sending hosts with
the localisation confidence, with per-connection evidence among them (a stuck connection, or
retransmitting flows of `MIN_HOSTS` hosts): on the lab, NICs alone named the link at the
other end of the same paths once in four flaps. When the connections' evidence fits both
ends of the same paths equally (a ring's traffic between two leaves), a blackhole is told
apart by the way its data crosses the link: a failed link's own leaf reroutes at once, the
other leaves keep sending to its spine for its leaf, so the link the blackholed traffic
(data, or acks where they were lost) enters its leaf by is named (`_blackhole`), once the
evidence shows an outage, not loss: a stuck connection, or flows that lost traffic in phases
with clean reports between (`_phased`). The window
spans several periods of a flapping link: its observations stay bad between phases and one
incident covers them all.
Packet loss that reaches the senders' timers names its link here too: the component the
loss detector names, one incident.
A host's own NIC or cable is not reported here (carrier, hw_nic_down name it), and what
timed out because of it is no evidence about the fabric: observations of connections into or
out of a NIC that lost its carrier within the window (down, or a flap) are set aside (a NIC
down for 1.5 s on the lab named a fabric link beside its own incident).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter, deque
from typing import Any, Hashable

from c4.core.topology import endpoint

from . import localise
from .config import DiagnosisConfig
from .counters import port_rates
from .findings import Finding, Suspect, describe, renamed
from .model import Cell, Comm, Model, Rank, Sock, bare_addr
from .slow import nic_path

COUNTER = "local_ack_timeout_err"
WINDOW_S = 30.0  # evidence window: several periods of a flapping link
MIN_BEATS = 2  # reports with ACK timeouts within the window that make a sending NIC bad
PAIR_S = 3.0  # a stall message and its sender's ACK timeouts (counters lag a report or two)
MIN_HOSTS = 2  # sending hosts whose bad observations the named link must explain
FLOW_RETRANS = 2  # retransmits in a report that count (one is a congestion drop's, mostly)
FLOW_REPORTS = 64  # retransmitting reports kept per flow (more than a window's worth)
# what a receiver can hold that its sender has not seen acknowledged: its receive buffer
# (net.ipv4.tcp_rmem's maximum, 6 MiB by default; 32 MiB allows for tuned hosts); a larger gap
# means the two ends' counters began apart (an agent started mid-connection), not lost acks
AHEAD_MAX = 32 << 20
# A socket dropped what it had received already (`last_drop_reason` of its drops in a report):
# its peer retransmitted data that had arrived, so what this end sent (its acks) was lost
DUPLICATE = frozenset({"TCP_OLD_DATA", "TCP_OLD_SEQUENCE"})
PHASE_GAP_S = 1.5  # ACK timeouts further apart than this are separate outages (1 s reports)

FlowKey = tuple[str, str, int, str, int]  # host, saddr, sport, daddr, dport
Named = tuple[Finding, frozenset[Hashable]]  # a finding and the bad observations behind it


class FlowCell:
    """A bulk TCP sender (eBPF tcp_flows): when it last moved data, the reports in which it
    retransmitted and those in which it moved data without, and what its path passes through
    (its source port's: model.route)."""

    __slots__ = ("job", "moved", "retrans", "clean", "tag", "path", "comps", "src", "dst",
                 "ends")

    def __init__(self, job: str | None, now: float) -> None:
        self.job = job
        self.moved = now
        self.retrans: deque[float] = deque(maxlen=FLOW_REPORTS)
        self.clean: deque[float] = deque(maxlen=FLOW_REPORTS)
        self.tag: tuple[Any, ...] | None = None  # model.route's cache key, as Cell.tag
        self.path: list[str] | None = None
        self.comps: list[localise.Component] = []
        self.src = self.dst = ""  # hosts
        self.ends = ""  # NIC -> NIC (host -> host where a NIC is unknown), as nic_path names it


Conn = tuple[Comm | None, Cell | FlowCell]  # a plugin connection or a flow (no comm)


class OutageDetector:
    def __init__(self, cfg: DiagnosisConfig, model: Model,
                 carrier_lost: dict[str, float]) -> None:
        self.cfg = cfg
        self.model = model
        self.carrier_lost = carrier_lost  # NIC endpoint -> its last carrier loss (Hardware's)
        # NIC endpoint -> (report, who counted) of its ACK timeouts: "nic" its RoCE counter,
        # "rto" its TCP flows' timeouts
        self.beats: dict[str, deque[tuple[float, str]]] = {}
        # comm -> (arrival, rank, peer) of connections in SendWait in a stall message
        self.waits: dict[str, deque[tuple[float, int, int]]] = {}
        self.flows: dict[FlowKey, FlowCell] = {}
        # each socket's last report: (arrival, bytes acked, bytes received, whether it moved no
        # data either way, whether it was timing out: retransmitting or an RTO)
        self.seen: dict[Sock, tuple[float, int, int, bool, bool]] = {}
        # a timing-out sender's socket -> (when, which way was lost: "acks" or "data")
        self.ways: dict[Sock, deque[tuple[float, str]]] = {}
        # the same from duplicates while it still moved: used by the blackhole tie-break only
        self.moving: dict[Sock, deque[tuple[float, str]]] = {}
        self.backs: dict[Sock, FlowCell] = {}  # a sender's socket -> its acks' way
        self.dups: dict[Sock, float] = {}  # a socket -> its last report dropping duplicates
        self.swept = 0.0  # last expiry of idle flows
        # component named -> (the bad observations that named it, when last): one fault, one
        # incident (_one_fault)
        self.named: dict[str, tuple[frozenset[Hashable], float]] = {}

    def on_rdma(self, host: str, section: dict[str, Any], interval: float, now: float) -> None:
        for port in section.get("ports", []):
            if port_rates(port, (COUNTER,), interval).get(COUNTER, 0.0) > 0:
                self._beat(endpoint(host, port["dev"]), now, "nic")

    def _beat(self, nic: str, now: float, by: str) -> None:
        """A report in which `nic` timed out, as one counter saw it (once per report)."""
        q = self.beats.setdefault(nic, deque())
        if (now, by) not in q:
            q.append((now, by))

    def on_stall(self, comm: Comm, rk: Rank, attrs: dict[str, Any], now: float) -> None:
        q = self.waits.setdefault(comm.comm, deque())
        for w in attrs.get("waiting", []):
            if w["dir"] == "send" and w["state"] == "SendWait" and w["peer"] != rk.rank:
                q.append((now, rk.rank, w["peer"]))

    def on_flows(self, host: str, section: dict[str, Any], now: float) -> None:
        """Bulk senders (acked `tcp_min_bytes` in a report) and their retransmitting reports.
        Any flow's retransmission timeouts are its NIC's ACK timeouts (a RoCE NIC counts its
        QPs'; TCP's are the kernel's, which no NIC counter sees). They do not make the flow
        bad: its acks may be what was lost (a link down blackholes both directions of the
        connections that cross it: the flows the other way time out on their acks); its
        retransmits say its data was, unless its receiver had the data (`_which_way`)."""
        floor = self.cfg.tcp_min_bytes
        for f in section.get("flows") or ():
            key = (host, f["saddr"], f["sport"], f["daddr"], f["dport"])
            fc = self.flows.get(key)
            sock = (bare_addr(f["saddr"]), f["sport"], bare_addr(f["daddr"]), f["dport"])
            if f["closed"]:
                self.flows.pop(key, None)
                for table in (self.seen, self.ways, self.moving, self.backs, self.dups):
                    table.pop(sock, None)
                continue
            self.seen[sock] = (now, f["bytes_acked"], f["bytes_received"],
                               f["bytes_acked_delta"] == 0 == f["bytes_received_delta"],
                               f["retrans_segs_delta"] > 0 or f.get("rto_delta", 0) > 0)
            if f.get("drops_delta", 0) > 0 and f.get("last_drop_reason") in DUPLICATE:
                self.dups[sock] = now
            self._which_way(sock)
            self._which_way(_reverse(sock))
            if f.get("rto_delta", 0) > 0:
                nic = self.model.nic_of_addr(bare_addr(f["saddr"]))
                if nic is not None:
                    self._beat(nic, now, "rto")
            lost = f["retrans_segs_delta"] >= FLOW_RETRANS
            if f["bytes_acked_delta"] >= floor:
                if fc is None:
                    fc = self.flows[key] = FlowCell(self.model.job_of_flow(host, f), now)
                fc.moved = now
                if not lost:
                    fc.clean.append(now)
            if fc is not None and lost:
                fc.retrans.append(now)

    def _which_way(self, sock: Sock) -> None:
        """Which way a timing-out sender's connection lost traffic, from both ends' reports.
        Once both stalled (no data either way in their last reports): its receiver holds
        data it never saw acknowledged (its acks were lost: its data got through), or exactly
        what it saw acknowledged (its data was lost). Measured on the lab (a link down, run
        J): node000's leaf00 -> leaf01 connection stalled with its receiver 26,844 bytes
        ahead (its data rerouted by its own leaf at once, its acks blackholed into leaf00),
        node002's leaf01 -> leaf00 one with its receiver level (its data blackholed).
        Still moving (a flap's 1 s outages): the end that dropped duplicates received what its
        peer resent needlessly, so what that end sent was lost: the receiver, the acks; the
        sender (the receiver's own messages back), the data. Measured on the lab (run M, a
        flap of leaf03-spine00 under C4P's spread): the leaf02 -> leaf03 connections'
        senders, the leaf03 -> leaf02 ones' receivers dropped duplicates in its phases."""
        s, r = self.seen.get(sock), self.seen.get(_reverse(sock))
        if s is None or r is None or not s[4] or abs(s[0] - r[0]) > PAIR_S:
            return
        if s[3] and r[3]:
            ahead = r[2] - s[1]
            way = "acks" if 1 < ahead <= AHEAD_MAX else "data" if abs(ahead) <= 1 else None
            table = self.ways
        else:
            mine, theirs = self._duplicates(sock, s[0]), self._duplicates(_reverse(sock), s[0])
            way = "data" if mine and not theirs else "acks" if theirs and not mine else None
            table = self.moving
        q = table.setdefault(sock, deque(maxlen=FLOW_REPORTS))
        if way is not None and (not q or q[-1][0] != s[0]):  # one verdict per sender report
            q.append((s[0], way))

    def _duplicates(self, sock: Sock, t: float) -> bool:
        """Whether the socket dropped duplicates in a report within PAIR_S of `t`."""
        d = self.dups.get(sock)
        return d is not None and abs(d - t) <= PAIR_S

    def _acks_lost(self, sock: Sock, start: float, moving: bool = False) -> bool:
        """Whether the connection's acks, not its data, were lost in the window: only ever
        its receiver ahead once stalled (a flap may lose either way in turn: then its data
        path, as before); with `moving`, only ever its receiver dropping the duplicates. Those
        decide the blackhole tie-break only: under loss a needless resend makes a receiver
        drop one as well (lab run O, 2 % loss up a leaf's uplink: flows taken for "acks"
        covered their acks' way, which shares only their hosts' own pair with their data's,
        and a host pair was named)."""
        ways = self.moving if moving else self.ways
        return {w for t, w in ways.get(sock, ()) if t >= start} == {"acks"}

    def _back(self, sock: Sock, job: str | None, now: float) -> FlowCell | None:
        """The way a connection's acks take: its receiver's socket, placed as a flow of its
        own, where C4P's map knows its 5-tuple's path (C4P traces every reported socket's,
        receivers' too). Not the NIC pair's default path where unknown: the acks' 5-tuple
        hashes on its own, and a guess would vote on a link they may never cross (a replay
        whose map knew only the senders' ports named nothing for a flap)."""
        peer = self.model.addrs.get(sock[2])
        if peer is None or self.model.sock_path(None, None, _reverse(sock)) is None:
            return None
        back = self.backs.get(sock)
        if back is None:
            back = self.backs[sock] = FlowCell(job, now)
        return back if self._flow_path((peer[0], *_reverse(sock)), back) else None

    def _expire(self, start: float) -> None:
        for nic in list(self.beats):
            beats = self.beats[nic]
            while beats and beats[0][0] < start - PAIR_S:
                beats.popleft()
            if not beats:
                del self.beats[nic]
        for cid in list(self.waits):
            q = self.waits[cid]
            while q and q[0][0] < start:
                q.popleft()
            if not q or cid not in self.model.comms:
                del self.waits[cid]
        if start - self.swept >= WINDOW_S:  # idle flows (closes missed): once a window
            self.swept = start
            for key in [k for k, fc in self.flows.items() if fc.moved < start]:
                del self.flows[key]
            for sock in [k for k, v in self.seen.items() if v[0] < start]:
                for table in (self.seen, self.ways, self.moving, self.backs, self.dups):
                    table.pop(sock, None)

    def tick(self, now: float) -> list[Finding]:
        return [f for f, bad in self._judge(now) if self._one_fault(f, bad, now)]

    def _one_fault(self, f: Finding, bad: frozenset[Hashable], now: float) -> bool:
        """Whether `f` is a fault of its own: not when every bad observation behind it was
        behind another component named within the window. The window keeps an outage's
        timeouts and stall messages for WINDOW_S, and when C4P moves the connections off the
        named link their stall messages at the reconnect place them on the new link (lab run
        H: a down leaf03-spine01 named, then leaf03-spine00 at 0.86 from a subset of the
        same NICs and connections)."""
        key = f.suspects[0].id
        for other, (theirs, at) in list(self.named.items()):
            if now - at > WINDOW_S:
                del self.named[other]
            elif other != key and bad <= theirs:
                return False
        if f.suspects[0].confidence >= self.cfg.localise_confidence:  # a tie names nothing
            self.named[key] = (bad | self.named.get(key, (frozenset(), now))[0], now)
        return True

    def _judge(self, now: float) -> list[Named]:
        start = now - WINDOW_S
        self._expire(start)
        beats = {nic: _reports(q, start) for nic, q in self.beats.items()}
        timed = {nic for nic, n in beats.items() if n >= MIN_BEATS}
        if not timed:
            return []  # nothing timed out repeatedly: the common case costs this much
        # a NIC that timed out once, within PAIR_S of one that did repeatedly, is one more
        # sender the same outage caught (a flap's phase may catch a host's flow once: lab run
        # K); once, alone, it is a lost tail (fixture 16-clean-after-replan)
        repeated = sorted(t for nic in timed for t, _ in self.beats[nic])
        timed |= {nic for nic, n in beats.items()
                  if n and any(_near(repeated, t) for t, _ in self.beats[nic] if t >= start)}
        covers: dict[Hashable, list[Conn]] = {}  # observation -> the connections it covers
        host: dict[Hashable, str] = {}  # observation -> its sending host
        bad: set[Hashable] = set()
        for comm in self.model.comms.values():
            for cell in comm.cells.values():
                s = comm.ranks.get(cell.src)
                if s is None or s.nic is None or cell.seen < start or \
                        self.model.components(comm, cell) is None:
                    continue
                if s.nic in timed or not beats.get(s.nic):
                    covers.setdefault(("nic", s.nic), []).append((comm, cell))
                    host[("nic", s.nic)] = s.host
                    if s.nic in timed:
                        bad.add(("nic", s.nic))
        for cid, q in self.waits.items():
            comm = self.model.comms[cid]
            for t, r, p in q:
                rk, got = comm.ranks.get(r), comm.cells.get((r, p))
                key = ("conn", cid, r, p)
                if rk is None or got is None or key in bad or not self._timed_out(rk, t) or \
                        self.model.components(comm, got) is None:
                    continue
                socks = self.model.rank_socks(rk, comm.ranks[p]) if p in comm.ranks else ()
                acks: list[Conn] = [(None, b) for b in (
                    self._back(k, comm.job, now) for k in socks if self._acks_lost(k, start))
                    if b is not None]
                # every socket of it lost its acks, not its data: it covers their way
                covers[key] = acks if socks and len(acks) == len(socks) else [(comm, got)]
                host[key] = rk.host
                bad.add(key)
        times = sorted(b for q in self.beats.values() for b, _ in q)
        # each sending host's own timeouts: a blackhole times out every sender through it, so
        # a flow's retransmits are an outage's only at its own sender's timeouts (a live lab
        # run: a node002 flow's retransmits fell within PAIR_S of a lone flap's timeouts on
        # node005; crossing the flap's neighbouring cable the other way, it named that cable)
        own: dict[str, list[float]] = {}
        for nic, at in self.beats.items():
            own.setdefault(nic.partition("/")[0], []).extend(t for t, _ in at)
        for ts in own.values():
            ts.sort()
        counts: dict[FlowKey, tuple[int, int]] = {}  # (at any timeout, at its sender's)
        for fk, fc in self.flows.items():
            if fc.moved >= start and self._flow_path(fk, fc):
                recent = [t for t in fc.retrans if t >= start]
                counts[fk] = (sum(1 for t in recent if _near(times, t)),
                              sum(1 for t in recent if _near(own.get(fk[0], []), t)))
        most: dict[str, int] = {}  # sending host -> its most persistent flow's reports
        for fk, (_, n) in counts.items():
            most[fk[0]] = max(n, most.get(fk[0], 0))
        anyone = max(most.values(), default=0)  # the most persistent flow's reports
        # flows that moved data cleanly at the timeouts, in as many reports as a bad one
        through: set[Hashable] = set()
        for fk, (near, n) in counts.items():
            # bad: at its sender's timeouts in MIN_BEATS reports, more than half as many as
            # its host's most persistent flow and more than a quarter as many as any flow's;
            # fewer, or only at other hosts' timeouts, is a bystander the stall and resume
            # disturbed, neither bad nor clear (measured: a leaf01 -> leaf00 flow in 2 reports
            # beside its host's flow through the down link in 4 named leaf01-spine01; a
            # leaf03 -> leaf00 flow in 2 beside flows through a flapping link in 8 and 9 named
            # leaf00-spine01)
            if near == 0 or (n >= MIN_BEATS and 2 * n > most[fk[0]] and 4 * n > anyone):
                obs = ("flow",) + fk
                sock = (bare_addr(fk[1]), fk[2], bare_addr(fk[3]), fk[4])
                fc = self.flows[fk]
                # its acks' way where they were lost; a flow clean at the timeouts clears its
                # data's way, whatever a needless retransmit of it once said (fixture 08: a
                # receiver's duplicate made one "acks", and it cleared the wrong direction)
                back = self._back(sock, fc.job, now) \
                    if near and self._acks_lost(sock, start) else None
                covers[obs] = [(None, back or fc)]
                host[obs] = fk[0]
                if near:
                    bad.add(obs)
                elif sum(1 for t in self.flows[fk].clean
                         if t >= start and _near(times, t)) >= MIN_BEATS:
                    through.add(obs)
        self._set_aside(covers, bad, start - PAIR_S)
        cells = {k: sorted({c for _, cell in conns for c in cell.comps})
                 for k, conns in covers.items()}
        lone = self._lone(bad, covers, cells, host, beats)
        if lone is not None:
            return lone
        ranked = localise.rank(bad, cells)
        top = ranked[0] if ranked else None
        topo = self.model.topology
        link = topo.links.get(localise.link_name(top.id)[0]) \
            if top is not None and top.kind == "link" and topo is not None else None
        if top is None or link is None or link.kind != "fabric" or \
                len({host[k] for k in top.bad}) < MIN_HOSTS:
            return []
        sure = top.posterior >= self.cfg.localise_confidence
        if sure and _per_connection(top, host, covers, set()):
            return [self._finding(top, covers, host, beats)]
        # NICs alone: the two ends of the same paths (measured: the wrong one); a blackhole
        # is told apart by the way its connections cross it (and says which way it failed),
        # else by flows that kept moving data through one end at the timeouts
        return self._blackhole(ranked, link.id, bad, host, covers, beats, now) or (
            [self._finding(top, covers, host, beats)]
            if sure and through and _per_connection(top, host, covers, through) else
            self._tie(ranked, top, host, covers, beats, now))

    def _lone(self, bad: set[Hashable], covers: dict[Hashable, list[Conn]],
              cells: dict[Hashable, list[localise.Component]], host: dict[Hashable, str],
              beats: dict[str, int]) -> list[Named] | None:
        """One NIC pair's connections time out across a link only they cross: no other host
        separates the links of their path (lab run E: a flap of leaf03-spine01, which only
        node005 -> node007 crossed, opened nothing). With its sender NIC's timeouts and
        per-connection evidence (a stuck connection, a retransmitting flow) that all joins one
        NIC pair, the path is named with its candidate links at the confidence the evidence
        gives (localise.name: split between them, not localised); probes.py's measuring probes
        may then single one out. None where the bad observations reach beyond that pair's
        hosts: MIN_HOSTS senders separate the links."""
        per = [k for k in bad if isinstance(k, tuple) and k[0] in ("conn", "flow")]
        ends = {_ends(m, cell) for k in per for m, cell in covers[k]}
        pair = ends.pop() if len(ends) == 1 else None
        src, _, dst = (pair or "").partition("->")
        hosts = {host[k] for k in bad}
        if len(hosts) >= MIN_HOSTS and (
                pair is None or hosts != {src.partition("/")[0], dst.partition("/")[0]}):
            return None
        # The receiver sends too (NCCL's clear-to-send writes, the lab ring's replies) and the
        # acks of that come back on the sender's 5-tuple, the data's way: a blackhole on it
        # times the receiver out as well, which says nothing about the ways the receiver's
        # own connections take (a 1 s flap of leaf03-spine01 timed node007 out with
        # node005: its NIC's observation, on node007's own sends, named host node007)
        recv = {k for k in bad if isinstance(k, tuple) and k[0] == "nic"
                and host[k] == dst.partition("/")[0] != src.partition("/")[0]}
        bad = bad - recv
        if pair is None or not any(isinstance(k, tuple) and k[0] == "nic" for k in bad):
            return []
        ranked = localise.rank(bad, {k: c for k, c in cells.items() if k not in recv})
        if not ranked or ranked[0].kind != "link":
            return []
        return [self._finding(ranked[0], covers, host, beats, pair)]

    def _set_aside(self, covers: dict[Hashable, list[Conn]], bad: set[Hashable],
                   since: float) -> None:
        """Drop the observations that cover a connection into or out of a NIC that lost its
        carrier since `since`: its own incident explains their timeouts."""
        lost = {ep for ep, t in self.carrier_lost.items() if t >= since}
        if not lost:
            return
        for key in [k for k, conns in covers.items()
                    if any(c[0] == "nic" and c[1] in lost for _, cell in conns
                           for c in cell.comps)]:
            del covers[key]
            bad.discard(key)

    def _blackhole(self, ranked: list[localise.Hypothesis], top: str, bad: set[Hashable],
                   host: dict[Hashable, str], covers: dict[Hashable, list[Conn]],
                   beats: dict[str, int], now: float) -> list[Named]:
        """The fabric link of a tie between the two ends of the same paths that the stuck
        connections' data enters its leaf by. A link that fails is dropped at once by its two
        ends (carrier loss is local): what its own leaf sends is rerouted, what the other
        leaves still hash onto its spine for its leaf is blackholed until the routes are
        withdrawn. Only for an outage, not loss (which may be one-way up, where the same
        connections lose the same way): with a stuck connection (progress stopped), or flows
        that lost traffic in separate phases (`_phased`: a flap's outages stall the ring too
        briefly for a stall message); when most connections' evidence enters one leaf by one
        link, and with flows of MIN_HOSTS hosts among them that retransmit: the data itself
        was lost (measured: connections stuck waiting for their acks, whose flows did not
        retransmit, entered the far leaf of a down link)."""
        topo = self.model.topology
        start = now - WINDOW_S
        keys = [k for k in bad if isinstance(k, tuple) and k[0] in ("conn", "flow")]
        if topo is None or not self._an_outage(keys, host, start):
            return []
        covers = {k: self._lost_way(k, conns, now) for k, conns in covers.items()}
        into: dict[str, list[tuple[Any, ...]]] = {}
        for k in keys:
            ends = {self._into_leaf(cell) for _, cell in covers[k]}
            if len(ends) == 1 and None not in ends:
                into.setdefault(str(ends.pop()), []).append(k)
        best = max(into, key=lambda c: len(into[c]), default=None)
        if best is None or 3 * len(into[best]) < 2 * len(keys) or \
                len({host[k] for k in into[best] if k[0] == "flow"}) < MIN_HOSTS:
            return []
        common = set.intersection(*({localise.link_name(c[1])[0] for _, cell in covers[k]
                                     for c in cell.comps
                                     if c[0] == "link" and c[3] == localise.PRIO_FABRIC}
                                    for k in into[best]))
        if top not in common:
            return []  # the evidence points elsewhere: no tie to break
        tied: dict[str, localise.Hypothesis] = {}
        for h in ranked:
            for cable in _cables(h):
                if cable in common:
                    tied.setdefault(cable, h)
        mass = _cable_mass(ranked)
        conf = sum(mass[cable] for cable in tied)
        if best not in tied or conf < self.cfg.localise_confidence:
            return []
        if tied[best].n_all > tied[best].n_bad and \
                any(h.n_all == h.n_bad for c, h in tied.items() if c != best):
            # traffic crossed it clean where the other end saw none clean: a blackhole into
            # the leaf would have taken that too (lab run AE: 5 % loss both ways on
            # leaf01-spine00 stalled the ring, and this named leaf02-spine00 beside it)
            return []
        f, bad_of = self._finding(tied[best], covers, host, beats)
        lk = topo.links[best]
        leaf = lk.a if topo.switches[lk.a].tier == "leaf" else lk.b
        f.suspects = [Suspect("link", best, None, None, conf)] + [
            Suspect(s.kind, s.id, s.host, s.rank, s.confidence * (1.0 - conf))
            for s in f.suspects if s.kind != "path" and s.id != best][:3]
        f.aliases = tuple(a for a in f.aliases if a != f"link:{best}")
        f.evidence["aliases"] = list(f.aliases)  # the named link is no alias of itself
        f.evidence.pop("candidate_links", None)
        f.evidence["direction"] = f"towards {leaf}"
        f.evidence["blackhole"] = {"into": leaf, "tied": sorted(tied),
                                   "connections_into": len(into[best]),
                                   "connections": len(keys)}
        f.summary = renamed(f.summary, f.suspects[0], self.cfg.localise_confidence)
        f.summary += (f"; {len(into[best])} of {len(keys)} connections' lost traffic (their "
                      f"data, or their acks where the receiver had the data) enters {leaf} "
                      f"by it, tied with {', '.join(c for c in sorted(tied) if c != best)}: "
                      "a blackhole drops what other leaves send towards the failed link's leaf")
        return [(f, bad_of)]

    def _tie(self, ranked: list[localise.Hypothesis], top: localise.Hypothesis,
             host: dict[Hashable, str], covers: dict[Hashable, list[Conn]],
             beats: dict[str, int], now: float) -> list[Named]:
        """An outage whose connections all cross the same fabric cables, which nothing here
        separated while it lasted: named, once it is over (no ACK timeout for PAIR_S), as a
        path finding whose candidates are those cables (not localised), for probes.py to
        measure. A down cable that only one other leaf's connections reach its leaf through
        (what a C4P plan left in two CI runs: leaf03 -> leaf00 alone through spine00) ties
        its two ends, and opened nothing: its leaf no longer forwarding to the spine is what
        the measuring legs then see. Not sooner: while the timeouts go on, the blackhole's
        way may still name one (lab run M's down of leaf02-spine00, at 3.9 s), and an
        unlocalised incident opened before it would be the ring's hang's to take over; but a
        phased outage (a flap) at once. The candidates include the top hypothesis's own cable
        aliases (a host's access cable)."""
        keys = [k for k in top.bad if isinstance(k, tuple) and k[0] in ("conn", "flow")]
        last = max((t for q in self.beats.values() for t, _ in q), default=now)
        # a flap is never over while it lasts: its phases, apart, gave the blackhole's way
        # its chances (bench/lab, 1 s / 3 s flaps: the tie opened only after the heal)
        if now - last < PAIR_S and not self._phased(keys, host, now - WINDOW_S):
            return []
        # an outage, not loss, as the blackhole's tie-break asks (a lossy link's tie is the
        # loss detector's, and measuring a second tie beside it slows both: a CI run's 5 %
        # loss was named by the probes in 31 s)
        if not self._an_outage(keys, host, now - WINDOW_S):
            return []
        crossed = [_fabric(covers[k]) for k in keys]
        common = _common_cables(crossed)
        mass = _cable_mass(ranked)
        # the cables the top hypothesis names beside its own (aliases: the same observations
        # exactly) tie with the fabric ones: a host's access cable where every bad connection
        # goes into or out of that host (a bench/lab flap of leaf00-spine00 after C4P's plan:
        # the cable both ways and node001's, 0.5 each, and nothing opened)
        tied = sorted(common | set(_cables(top)), key=lambda c: (-mass.get(c, 0.0), c))
        if len(tied) < 2 or localise.link_name(top.id)[0] not in common or \
                sum(mass.get(c, 0.0) for c in tied) < self.cfg.localise_confidence:
            return []
        f, bad_of = self._finding(top, covers, host, beats)
        ways = set.intersection(*crossed)
        # no more than an even share each: the sum over a cable's directions names one only
        # with the blackhole's way (the split is the brake elsewhere, _cable_mass)
        even = sum(mass.get(c, 0.0) for c in tied) / len(tied)
        f.suspects = [Suspect("link", c, None, None, min(mass.get(c, 0.0), even))
                      for c in tied][:4]
        f.evidence["candidate_links"] = {
            c: (f"towards {to.pop()}" if len(to) == 1 else "both") for c in tied
            for to in [{d.partition("=>")[2] for d in ways if localise.link_name(d)[0] == c}]}
        f.summary = renamed(f.summary, f.suspects[0], self.cfg.localise_confidence)
        f.summary += f"; every connection crosses {' and '.join(tied)}"
        return [(f, bad_of)]

    def _lost_way(self, k: Hashable, conns: list[Conn], now: float) -> list[Conn]:
        """The way an observation's lost traffic took, as the blackhole tie-break reads it:
        what it covers, or for a bad flow whose receiver dropped the duplicates of its resends
        (and its sender none) in every verdict of the window, its acks' way (`_which_way`)."""
        if not isinstance(k, tuple) or k[0] != "flow":
            return conns
        start = now - WINDOW_S
        fk: FlowKey = k[1:]
        sock = (bare_addr(fk[1]), fk[2], bare_addr(fk[3]), fk[4])
        fc = self.flows.get(fk)
        if fc is None or self._acks_lost(sock, start) or \
                not self._acks_lost(sock, start, moving=True):
            return conns
        back = self._back(sock, fc.job, now)
        return [(None, back)] if back is not None else conns

    def _an_outage(self, keys: list[tuple[Any, ...]], host: dict[Hashable, str],
                   start: float) -> bool:
        """Traffic lost in an outage, not to loss: a stuck connection (progress stopped), or
        flows that lost it in separate phases (`_phased`)."""
        return any(k[0] == "conn" for k in keys) or self._phased(keys, host, start)

    def _phased(self, keys: list[tuple[Any, ...]], host: dict[Hashable, str],
                start: float) -> bool:
        """Whether the bad flows lost traffic in separate outages, not continuously: each moved
        data cleanly in more than half as many reports as it retransmitted in, between its
        first retransmitting report and its last (through a 1 s / 3 s flap a flow retransmits
        in about half its reports, its timer backing off past the down phase: asking for more
        clean reports than those left bench/lab's flaps of 2026-12-07 no outage), and their
        senders' ACK timeouts fall in MIN_BEATS phases or more
        (PHASE_GAP_S apart), each timing out MIN_HOSTS of them at once. A lossy link makes
        its flows retransmit report after report; a flapping one stops them all together,
        phase after phase, and passes their data cleanly between (fixtures 19, a flap: an
        outage once its phases accumulate; 20, 2 % loss one way: never; tests/unit/
        test_diag_outage_tie.py)."""
        flows = [k for k in keys if k[0] == "flow"]
        for k in flows:
            fc = self.flows.get(k[1:])
            if fc is None:
                return False
            lost = sorted(t for t in fc.retrans if t >= start)
            if not lost or 2 * sum(1 for t in fc.clean if lost[0] < t < lost[-1]) <= len(lost):
                return False
        hosts = {host[k] for k in flows}
        timeouts = sorted((t, nic.partition("/")[0]) for nic, q in self.beats.items()
                          if nic.partition("/")[0] in hosts for t, _ in q if t >= start)
        phases, last, caught = 0, None, set()
        for t, h in timeouts + [(float("inf"), "")]:
            if last is not None and t - last > PHASE_GAP_S:
                phases += 1 if len(caught) >= MIN_HOSTS else 0
                caught = set()
            caught.add(h)
            last = t
        return phases >= MIN_BEATS

    def _into_leaf(self, cell: Cell | FlowCell) -> str | None:
        """The fabric link (cable) by which a connection's data enters a leaf, if one."""
        topo = self.model.topology
        got = set()
        for c in cell.comps:
            cable, to = localise.link_name(c[1])
            sw = topo.switches.get(to) if topo is not None and to else None
            if c[0] == "link" and c[3] == localise.PRIO_FABRIC and sw is not None and \
                    sw.tier == "leaf":
                got.add(cable)
        return got.pop() if len(got) == 1 else None

    def _timed_out(self, rk: Rank, t: float) -> bool:
        nics = [rk.nic] if rk.nic else [n for n in self.beats if n.partition("/")[0] == rk.host]
        return any(abs(b - t) <= PAIR_S for n in nics for b, _ in self.beats.get(n, ()))

    def _flow_path(self, fk: FlowKey, fc: FlowCell) -> bool:
        """Whether the flow's ends are known (fc.comps set): both ends' hosts and NICs from
        their addresses, the path its source port takes (model.route: C4P's map for a
        planned port, else the NIC pair's)."""
        host = fk[0]
        saddr, daddr = bare_addr(fk[1]), bare_addr(fk[3])
        peer = self.model.addrs.get(daddr)
        if peer is None or peer[0] == host:
            return False
        fc.src, fc.dst = host, peer[0]
        s_nic = self.model.nic_of_netdev(host, self.model.addrs.get(saddr, (host, None))[1])
        d_nic = self.model.nic_of_netdev(*peer)
        fc.ends = f"{s_nic or host}->{d_nic or peer[0]}"
        self.model.place(fc, host, s_nic, peer[0], d_nic, ((saddr, fk[2], daddr, fk[4]),))
        return True

    def _finding(self, top: localise.Hypothesis, covers: dict[Hashable, list[Conn]],
                 host: dict[Hashable, str], beats: dict[str, int],
                 path: str | None = None) -> Named:
        comp = next(c for k in top.bad for _, cell in covers[k] for c in cell.comps
                    if (c[0], c[1]) == (top.kind, top.id))
        conns = list({id(c): (m, c) for k in top.bad for m, c in covers[k]
                      if comp in c.comps}.values())
        jobs = Counter(c.job if isinstance(c, FlowCell) else m.job if m is not None else None
                       for m, c in conns)
        job = jobs.most_common(1)[0][0] if jobs else None
        comm = next((m for m, _ in conns if m is not None and m.job == job), None)
        # connections of a communicator are plugin cells (flows have none)
        if path is None and comm is not None and all(m is comm for m, _ in conns):
            path = nic_path(comm, [(c.src, c.dst) for _, c in conns if isinstance(c, Cell)])
        suspects, named, aliases = localise.name(top, path)
        nics = sorted(str(k[1]) for k in top.bad if isinstance(k, tuple) and k[0] == "nic")
        stuck = sorted(f"{k[2]}->{k[3]}" for k in top.bad if isinstance(k, tuple) and k[0] == "conn")
        flows = sorted(f"{k[1]} {k[2]}:{k[3]}->{k[4]}:{k[5]}" for k in top.bad
                       if isinstance(k, tuple) and k[0] == "flow")
        hosts = sorted({host[k] for k in top.bad})
        backs = {id(b) for b in self.backs.values()}
        acks = sorted({f"{c.dst}->{c.src}" for k in top.bad for _, c in covers[k]
                       if id(c) in backs})
        ev: dict[str, Any] = {
            "ack_timeout_reports": {n: beats[n] for n in nics[:16]},  # per NIC, in the window
            "stuck_connections": stuck[:16],  # in SendWait in stall messages, timed out
            "retransmitting_flows": flows[:16],  # eBPF tcp_flows, retransmits at the timeouts
            "sending_hosts": hosts[:16],
            # connections whose receivers had the data their senders timed out on: their
            # acks' way voted, not their data's
            "acks_lost": acks[:16],
            "observations_through_suspect": top.n_all,
            "connections": sorted({f"{c.src}->{c.dst}" for _, c in conns})[:16],
            "window_s": WINDOW_S,
            **named,
        }
        across = "one path" if suspects[0].kind == "path" else "one link"
        summary = (f"{len(hosts)} host(s)' connections across {across} hit ACK timeouts "
                   f"(traffic blackholed or dropped: a link down, flapping or losing packets) "
                   f"in the last {WINDOW_S:.0f}s: {len(nics)} NIC(s) repeatedly, "
                   f"{len(stuck)} connection(s) stuck in stall messages, {len(flows)} TCP "
                   f"flow(s) retransmitting at the timeouts; "
                   f"{top.n_all - top.n_bad} observation(s) through it clean; suspect: "
                   f"{describe(suspects[0], self.cfg.localise_confidence)}")
        first = min((t for n in nics for t, _ in self.beats[n]), default=None)
        if first is None:
            first = min((t for q in self.waits.values() for t, _, _ in q),
                        default=min((t for fc in self.flows.values() for t in fc.retrans),
                                    default=0.0))
        return Finding("comm_slow", job, comm.comm if comm else None, suspects, summary, ev,
                       first, aliases=aliases), frozenset(top.bad)


def _cable_mass(ranked: list[localise.Hypothesis]) -> dict[str, float]:
    """Posterior per fabric cable: the hypotheses that it failed one way or both are one
    cable to name where the blackhole's way of crossing it breaks a tie (measured on the lab:
    a link down at 0.55 both ways and 0.43 into its leaf named nothing at 0.8). Elsewhere the
    top hypothesis alone must reach it, as before: with the sum everywhere, one CI run named
    a second link (two hosts' retransmitting flows) beside a flapping one, not reproduced in 3
    local runs; the split is kept as a brake there.
    A hypothesis whose aliases are other cables (the two ends of the same paths explaining the
    same observations: its posterior split between them) gives each its share: lab run M's down
    of leaf02-spine00 under C4P's spread tied with leaf03-spine00 inside one hypothesis, 0.48
    each, and the blackhole's way named nothing."""
    mass: dict[str, float] = {}
    for h in ranked:
        for cable in _cables(h):
            mass[cable] = mass.get(cable, 0.0) + h.posterior
    return mass


def _cables(h: localise.Hypothesis) -> list[str]:
    """The cables a link hypothesis names: its own, then those of its aliases."""
    if h.kind != "link":
        return []
    ids = [h.id] + [cid for kind, _, cid in (a.partition(":") for a in h.aliases)
                    if kind == "link"]
    return list(dict.fromkeys(localise.link_name(cid)[0] for cid in ids))


def _ends(comm: Comm | None, cell: Cell | FlowCell) -> str | None:
    """The NIC pair a connection joins, as nic_path names it; None where an end is unknown."""
    if isinstance(cell, FlowCell):
        return cell.ends or None
    return nic_path(comm, [(cell.src, cell.dst)]) if comm is not None else None


def _reports(beats: deque[tuple[float, str]], start: float) -> int:
    """The reports since `start` in which a NIC timed out, as the counter that saw most of them
    counts them: one timeout seen by both lands in two reports where one counter lags (the
    lab's NIC copies the kernel's TCPTimeouts a report after the flow's `rto`: one congestion
    timeout on the clean ring made a NIC bad, lab run K, fixture 16-clean-after-replan)."""
    got = Counter(by for t, by in beats if t >= start)
    return max(got.values(), default=0)


def _reverse(sock: Sock) -> Sock:
    """The other end's socket of a connection."""
    return (sock[2], sock[3], sock[0], sock[1])


def _near(times: list[float], t: float) -> bool:
    """Whether an ACK timeout (sorted `times`) was counted within PAIR_S of `t`: a flow's
    retransmits away from every timeout are congestion drops, not an outage."""
    i = bisect_left(times, t - PAIR_S)
    return i < len(times) and times[i] <= t + PAIR_S


def _per_connection(top: localise.Hypothesis, host: dict[Hashable, str],
                    covers: dict[Hashable, list[Conn]], through: set[Hashable]) -> bool:
    """Whether per-connection evidence alone names the link: a stuck connection or
    retransmitting flows of MIN_HOSTS hosts, and the top's link the only fabric link that
    every one of them crosses, not counting the directions that flows crossed while moving
    data cleanly at the timeouts (`through`). Connections of one leaf pair all cross both
    ends of their paths (measured: a link down named the far end from those with the NICs'
    votes); a flow from the same leaf through the same spine to another leaf that kept
    moving data at the outages clears the near end's direction (lab run E: a flap of
    leaf01-spine00, every bad flow leaf02 -> spine00 -> leaf01, a clean one leaf02 -> spine00
    -> leaf03; a down leaf00-spine01, bad connections both ways between leaf00 and leaf01,
    clean flows leaf01 -> spine01 -> leaf02: both named by nothing). A flow clean only
    between outages (rerouted after a link went down) clears nothing."""
    keys = [k for k in top.bad if isinstance(k, tuple) and k[0] in ("conn", "flow")]
    if not any(k[0] == "conn" for k in keys) and \
            len({host[k] for k in keys if k[0] == "flow"}) < MIN_HOSTS:
        return False
    crossed = [_fabric(covers[k]) for k in keys]

    def common(cleared: set[str]) -> set[str]:  # the cables every one crosses, not cleared
        return _common_cables([d - cleared for d in crossed])

    # (a flow crossing a lossy link moves data cleanly in some reports: the caller clears
    # only to break the tie of two path ends, never to unname what the bad ones alone name)
    return common(set().union(*(_fabric(covers[k]) for k in through))) == \
        {localise.link_name(top.id)[0]}


def _common_cables(crossed: list[set[str]]) -> set[str]:
    """The cables every one of these directed-link sets (`_fabric`) crosses."""
    return set.intersection(*({localise.link_name(c)[0] for c in d} for d in crossed))


def _fabric(conns: list[Conn]) -> set[str]:
    """The directed fabric links (`cable=>switch`) the connections cross."""
    return {c[1] for _, cell in conns for c in cell.comps
            if c[0] == "link" and c[3] == localise.PRIO_FABRIC and "=>" in c[1]}
