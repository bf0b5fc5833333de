"""Probes that separate the candidate links of a fault C4D can only name as a path.

A connection that starts to look bad and whose path is unknown (no topology path, no learned
one) is traced at once (`trace`): by the time it is judged, its links vote.

A path finding (localise.name: `candidate_links`) means the connections that explain a fault
cross several unrelated links equally. Another connection, of any job, that crosses some of
them but not all separates them (slow.py pools other jobs' connections; loss.py votes over all
of them) once its path is known. Connections whose path is unknown (no topology path, no
learned one) but whose equal-cost paths could cross a candidate are worth a probe: C4P traces
their 5-tuples (aggregator/planner/service.py, rate limited there), and the learned path
enters the next vote (model.learned_path).

When no connection separates them (a ring alone on its leaves: what goes up `leafA=>spineS`
comes down `spineS=>leafB`, nothing else crosses either), the candidates are *measured*
(`Measure`): an agent under each candidate's leaf sends `count` datagrams of one fixed 5-tuple
whose hop at `ttl` is the candidate's far switch (TTL 2: the spine, TTL 1: the leaf), so they
cross that leaf's up link and the reply its down link and nothing else of the fabric. Each
*leg* (source NIC, TTL, answering switch) is a vote: lossy or slow against the other legs, or
clean where it would have seen what the lossy one saw. The candidate that the legs alone
single out names the fault; legs that see nothing vote for nothing (docs/diagnosis.md).
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol

from c4.core.topology import Topology, access_link_id, fabric_link_id, pair_hosts

from .findings import Finding, Suspect, renamed
from .localise import directed
from .model import LEARNED_REFRESH_S, Cell, Comm, Model

RETRY_S = 60.0  # a NIC pair is asked about again at most this often
PER_TICK = 8  # new requests per evaluation


class Prober:
    def __init__(self, model: Model) -> None:
        self.model = model
        self.asked: dict[tuple[str, str], float] = {}  # NIC pair -> when last asked
        self.requested = 0  # requests C4P accepted (a live flow to trace)
        self._cands: dict[tuple[str, str], list[frozenset[str]]] = {}

    def trace(self, comm: Comm, cells: Iterable[Cell], now: float) -> int:
        """Ask for the paths of these connections where unknown; returns requests accepted."""
        sent = 0
        for cell in cells:
            s, d = comm.ranks.get(cell.src), comm.ranks.get(cell.dst)
            if sent < PER_TICK and s is not None and d is not None and \
                    self._unknown(comm, cell):
                sent += self._ask(s.nic, d.nic, now)
        return sent

    def _unknown(self, comm: Comm, cell: Cell) -> bool:
        """Neither the topology nor a probe gave the connection's path (model.components
        looks it up; a cell's path is only as fresh as its last lookup)."""
        return self.model.components(comm, cell) is not None and cell.path is None

    def _ask(self, src: str | None, dst: str | None, now: float) -> int:
        if self.model.paths is None or not src or not dst or \
                now - self.asked.get((src, dst), -1e18) < RETRY_S:
            return 0
        self.asked[(src, dst)] = now
        ok = self.model.paths.request_probe(src, dst, now)
        if ok:  # look the answer up within a second, not at the next refresh
            self.model.learned[(src, dst)] = (None, now - LEARNED_REFRESH_S + 1.0)
        self.requested += ok
        return int(ok)

    def separate(self, candidates: Iterable[str], now: float) -> int:
        """Ask for the paths of connections that could cross some of the candidate links (cable
        ids) but not all; returns how many requests were accepted."""
        want = frozenset(candidates)
        if self.model.topology is None or self.model.paths is None or len(want) < 2:
            return 0
        sent = 0
        for comm in self.model.comms.values():
            for cell in comm.cells.values():
                if sent >= PER_TICK:
                    return sent
                s, d = comm.ranks.get(cell.src), comm.ranks.get(cell.dst)
                if s is None or d is None or not s.nic or not d.nic or \
                        not self._unknown(comm, cell):
                    continue
                pair = (s.nic, d.nic)
                if now - self.asked.get(pair, -1e18) < RETRY_S or not any(
                        want & p and not want <= p for p in self._paths(pair)):
                    continue  # asked lately, or every path it could take crosses all or none
                sent += self._ask(s.nic, d.nic, now)
        return sent

    def _paths(self, pair: tuple[str, str]) -> list[frozenset[str]]:
        got = self._cands.get(pair)
        if got is None:
            topo = self.model.topology
            got = self._cands[pair] = [frozenset(p) for p in topo.candidate_paths(*pair)] \
                if topo is not None else []
        return got

    def forget(self, now: float) -> None:
        for pair in [p for p, t in self.asked.items() if now - t > RETRY_S]:
            del self.asked[pair]


# -- measuring probes ---------------------------------------------------------------------
# datagrams per leg and round: ~100/s per leg on average, inside what the agent's token
# bucket (500/s, all its probes) and a switch's ICMP policer allow
MEASURE_COUNT = 400
ROUND_S = 4.0  # a leg is measured again about this often while its path finding lasts ...
# ... each gap drawn over 0.5-1.5 of it, per leg and round (seeded: a replay asks as live did).
# Rounds at a fixed period sample a periodic fault at one phase (the lab's 1 s down / 3 s up
# flap, measured every 4 s, lost 0-5 of 400 a round: its down phases fell between rounds),
# and so did gaps spread over 0.75-1.25 by a fixed sequence: asked at the 1 s ticks they
# came 4 or 5 s apart and held a flap of 4.3 s in its up phases for 30 s (fixture 29)
WINDOW_S = 60.0  # rounds older than this no longer vote
MIN_ROUNDS = 2  # rounds a leg needs before it votes
MIN_LOST = 3  # lost datagrams, in at least MIN_ROUNDS rounds, before a leg is lossy ...
HOLD_S = 8.0  # ... the first and last of them this far apart: another tenant's burst is shorter
# RTT votes from rounds no burst covers all of: MIN_ROUNDS rounds HOLD_S apart (their lowest
# p90), or RTT_ROUNDS rounds (their lower median ignores two a burst could cover). Counting
# rounds alone waited 35 s in the lab, where a slow leg's round kept its prober busy 6.5 s.
RTT_ROUNDS = 4
BACKGROUND_LOSS = 1e-4  # what a healthy leg loses (answers a router's ICMP policer drops)
P_LOSSY = 1e-3  # a leg is lossy when background loss this unlikely explains its losses
P_CLEAN = 1e-2  # ... and clean when the lossy legs' rate this unlikely gives its few losses
RTT_RATIO, RTT_MIN_MS, RTT_CLEAN = 2.0, 0.2, 1.3  # p90 vs the best leg of the same TTL
# A unique verdict of the legs multiplies the odds of the passive evidence for the path (its
# share, before the split between candidates) by this: loss measured on one link and not on
# the other is direct evidence, and asked for only where the connections already point.
PROBE_ODDS = 100.0


@dataclass(frozen=True)
class Leg:
    """Datagrams from NIC `src` towards NIC `dst` with TTL `ttl`, on a 5-tuple whose hop at
    `ttl` is switch `via`: they stop there (ICMP time exceeded) and cross only the source's
    access cable and, with TTL 2, its leaf's fabric link to `via`, both ways."""
    src: str
    dst: str
    ttl: int
    via: str


@dataclass
class LegResult:
    sent: int
    answered: int
    rtt_p50_ms: float | None = None
    rtt_p90_ms: float | None = None
    error: str | None = None
    elsewhere: int = 0  # ports whose hop answered from another switch than `via`


class Measurer(Protocol):
    """Agents that measure legs (the simulator's in a replay, lab/sim.py)."""

    def measure(self, leg: Leg, count: int, now: float) -> bool:
        """Start `count` datagrams on the leg soon, within the agents' probe rate; False when
        refused (no agent on the source host, rate limited)."""

    def results(self, now: float) -> list[tuple[Leg, LegResult]]:
        """Legs measured since the last call."""


ROCE_SPORTS = (0xC000, 0xFFFF)  # the source ports a leg's 5-tuple is picked from
LEG_SPORTS = 32  # ports offered per leg: with S spines, one reaches the wanted one but for
# (1 - 1/S)^32 of the time (S = 8: 1.4 %)
# ports of a leg's round that must have answered, every one from another switch, for the round
# to say its leaf no longer forwards to `via` (silence says nothing: an ICMP policer)
UNREACHED_PORTS = LEG_SPORTS // 2
OUTBOX_MAX = 256  # requests not taken by a sender (a replay has none) are dropped, oldest first
ANSWER_S = 30.0  # a request unanswered this long is forgotten
MEASURE_ID = "measure-"  # how a measuring request's probe_id begins (C4P's traces differ)


class AgentMeasurer:
    """Measures legs with the agents (`probe` with `measure`, agent/probe.py): the request goes
    to the leg's source host through the server's outbox (`take_outbox`), the agent's
    `probe_result` comes back through Diagnosis.observe (`on_result`)."""

    def __init__(self, topology: Topology) -> None:
        self.topo = topology
        self.outbox: deque[tuple[str, str, dict[str, Any]]] = deque(maxlen=OUTBOX_MAX)
        self.pending: dict[str, tuple[float, Leg]] = {}
        self.done: list[tuple[Leg, LegResult]] = []
        self.seq = 0

    def measure(self, leg: Leg, count: int, now: float) -> bool:
        host, _, dev = leg.src.partition("/")
        src, dst = self._addr(leg.src), self._addr(leg.dst)
        via = answer_addrs(self.topo, leg)
        if src is None or dst is None or (leg.ttl >= 2 and not via):
            return False  # without the spine's addresses a port on another spine would do
        self.seq += 1
        pid = f"{MEASURE_ID}{int(now * 1000)}-{self.seq}"
        lo, hi = ROCE_SPORTS
        step = (hi - lo) // LEG_SPORTS
        base = lo + (self.seq * 7919) % step  # a different port set every round
        probe: dict[str, Any] = {
            "id": "leg", "proto": "roce", "dst": dst, "src": src, "dev": dev,
            "sports": [base + i * step for i in range(LEG_SPORTS)],
            "measure": {"count": count, "ttl": leg.ttl, **({"via": via} if via else {})}}
        self.outbox.append((host, "probe", {"probe_id": pid, "probes": [probe],
                                            "reason": "C4D: which candidate link of a path"}))
        self.pending[pid] = (now, leg)
        for old in [k for k, (t, _) in self.pending.items() if now - t > ANSWER_S]:
            del self.pending[old]
        return True

    def on_result(self, host: str, body: dict[str, Any], now: float) -> None:
        got = self.pending.pop(body.get("probe_id", ""), None)
        if got is None:
            return  # C4P's trace, or an answer given up on
        for r in body["results"]:
            self.done.append((got[1], _leg_result(r)))

    def results(self, now: float) -> list[tuple[Leg, LegResult]]:
        out, self.done = self.done, []
        return out

    def take_outbox(self) -> list[tuple[str, str, dict[str, Any]]]:
        out = list(self.outbox)
        self.outbox.clear()
        return out

    def _addr(self, ep: str) -> str | None:
        host, _, dev = ep.partition("/")
        h = self.topo.hosts.get(host)
        nic = h.nic(dev) if h else None
        return nic.addr if nic else None

def answer_addrs(topo: Topology, leg: Leg) -> list[str]:
    """Addresses the leg's switch may answer from: its interface on the leg's link (routers
    answer from the inbound interface), then its loopbacks."""
    host, _, dev = leg.src.partition("/")
    nic = topo.hosts[host].nic(dev) if host in topo.hosts else None
    if nic is None:
        return []
    link = topo.links.get(fabric_link_id(nic.leaf, leg.via) if leg.ttl >= 2 else
                          access_link_id(host, nic.name, nic.leaf))
    sw = topo.switches.get(leg.via)
    out = [link.addrs[leg.via]] if link is not None and leg.via in link.addrs else []
    return list(dict.fromkeys(out + (sw.addrs if sw else [])))[:16]


class RecordedMeasurer:
    """Answers C4D's measuring probes in a replay of a lab recording from the recording's own
    measurements: an ask is answered by the next recorded `probe_result` of the same leg (its
    source host, its TTL and the switch address that answered) within ANSWER_S. The live run
    asked at its own times, so a leg it never measured stays unanswered (a round that reached
    no port to the leg's switch, by its source host and TTL alone); without this a
    replay scores a fault the live C4D named by measuring as missed (lab run O: loss named
    live by the probes 3 of 4 times, replayed 1 of 4)."""

    def __init__(self, topology: Topology) -> None:
        self.topo = topology
        self.asked: dict[Leg, float] = {}
        self.done: list[tuple[Leg, LegResult]] = []

    def measure(self, leg: Leg, count: int, now: float) -> bool:
        if leg.ttl >= 2 and not answer_addrs(self.topo, leg):
            return False
        self.asked.setdefault(leg, now)
        return True

    def on_result(self, host: str, body: dict[str, Any], now: float) -> None:
        """A recorded `probe_result` as the replay reaches it (its frame's host)."""
        if not str(body.get("probe_id", "")).startswith(MEASURE_ID):
            return
        for old in [lg for lg, t in self.asked.items() if now - t > ANSWER_S]:
            del self.asked[old]
        for r in body.get("results") or ():
            hops = r.get("hops") or []
            # a round that reached no port to the switch has no answering address of it
            gone = r.get("elsewhere", 0) and not r.get("sent")
            leg = next((lg for lg in self.asked if hops and lg.src.partition("/")[0] == host
                        and lg.ttl == len(hops) and
                        (gone or hops[-1] in answer_addrs(self.topo, lg))), None)
            if leg is not None:
                del self.asked[leg]
                self.done.append((leg, _leg_result(r)))

    def results(self, now: float) -> list[tuple[Leg, LegResult]]:
        out, self.done = self.done, []
        return out


def _leg_result(r: dict[str, Any]) -> LegResult:
    """A `probe_result.results` entry of a measured leg."""
    rtt = r.get("rtt_us") or []
    return LegResult(r.get("sent", 0), r.get("answered", 0),
                     rtt[0] / 1000 if rtt else None, rtt[1] / 1000 if len(rtt) > 1 else None,
                     r.get("error"), r.get("elsewhere", 0))


def leg_links(topo: Topology, leg: Leg) -> frozenset[str]:
    """Directed components (localise.directed) and the NIC a leg's datagrams and answers
    cross."""
    host, _, dev = leg.src.partition("/")
    h = topo.hosts.get(host)
    nic = h.nic(dev) if h else None
    if nic is None:
        return frozenset()
    acc = access_link_id(host, nic.name, nic.leaf)
    out = {f"nic:{leg.src}", directed(acc, nic.leaf), directed(acc, leg.src)}
    if leg.ttl >= 2:
        fab = fabric_link_id(nic.leaf, leg.via)
        out |= {directed(fab, leg.via), directed(fab, nic.leaf)}
    return frozenset(out)


def candidates(topo: Topology, f: Finding) -> dict[str, frozenset[str]]:
    """A path finding's candidate links (cable -> its directed components that the evidence
    blames: `towards X`, or both ways)."""
    out: dict[str, frozenset[str]] = {}
    for cable, how in (f.evidence.get("candidate_links") or {}).items():
        lk = topo.links.get(cable)
        if lk is None:
            continue
        to = how.split()[1] if how.startswith("towards ") else None
        out[cable] = frozenset([directed(cable, to)] if to in (lk.a, lk.b) else
                               [directed(cable, lk.a), directed(cable, lk.b)])
    return out


@dataclass
class _Rounds:
    asked: float = -1e18
    pending: bool = False
    n: int = 0  # rounds asked
    rounds: deque[tuple[float, LegResult]] = field(default_factory=deque)
    # when rounds had every port answered from another switch (none reaching `via`)
    unreached: deque[float] = field(default_factory=deque)


def _poisson_sf(k: int, lam: float) -> float:
    """P(X >= k), X ~ Poisson(lam): a binomial of small rate."""
    if k <= 0:
        return 1.0
    term = total = math.exp(-lam)
    for i in range(1, k):
        term *= lam / i
        total += term
    return max(0.0, 1.0 - total)


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k), X ~ Binomial(n, p), summed in logs (n may be thousands)."""
    if k >= n or p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    lp, lq, top = math.log(p), math.log1p(-p), math.lgamma(n + 1)
    return min(1.0, sum(math.exp(top - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * lp + (n - i) * lq) for i in range(k + 1)))


class Measuring:
    """Measures the candidate links of path findings and names the one the legs single out."""

    def __init__(self, model: Model, confidence: float) -> None:
        self.model = model
        self.confidence = confidence  # localise_confidence: what a named suspect must reach
        # the agents, where there is a topology to pick legs from (a replay: what
        # replay(measurer=) gives, else nothing answers)
        self.measurer: Measurer | None = \
            AgentMeasurer(model.topology) if model.topology is not None else None
        self.legs: dict[Leg, _Rounds] = {}
        # The hosts this aggregator can send to (the server's routes, use_routes); None: all
        # (a replay). Under federation a leaf's hosts may report to another aggregator.
        self.routed: Callable[[str], bool] | None = None
        self.unasked = 0  # candidate rounds not measured: no routed host under the leaf
        self._unasked_at: dict[str, float] = {}  # candidate cable -> when last counted

    def on_result(self, host: str, body: dict[str, Any], now: float) -> None:
        """An agent's `probe_result`: a measured leg, or C4P's trace (not ours)."""
        if isinstance(self.measurer, (AgentMeasurer, RecordedMeasurer)):
            self.measurer.on_result(host, body, now)

    def take_outbox(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(host, kind, body) frames for the agents."""
        return self.measurer.take_outbox() if isinstance(self.measurer, AgentMeasurer) else []

    def collect(self, now: float) -> None:
        if self.measurer is None:
            return
        for leg, res in self.measurer.results(now):
            st = self.legs.get(leg)
            if st is not None:
                st.pending = False
                if not res.error and res.sent:
                    st.rounds.append((now, res))
                elif res.sent == 0 and res.elsewhere >= UNREACHED_PORTS:
                    st.unreached.append(now)
        for leg in [k for k, st in self.legs.items() if now - st.asked > WINDOW_S]:
            del self.legs[leg]
        for cable in [c for c, t in self._unasked_at.items() if now - t > WINDOW_S]:
            del self._unasked_at[cable]
        for st in self.legs.values():
            while st.rounds and now - st.rounds[0][0] > WINDOW_S:
                st.rounds.popleft()
            while st.unreached and now - st.unreached[0] > WINDOW_S:
                st.unreached.popleft()

    def resolve(self, f: Finding, now: float) -> Finding:
        """Measure a path finding's candidates; when the legs single one out, the finding
        names that link."""
        topo = self.model.topology
        top = f.top
        if self.measurer is None or topo is None or top is None or \
                top.kind not in ("path", "link"):
            return f
        cands = candidates(topo, f)
        if len(cands) < 2:
            return f  # a link finding without a tie (most): nothing to measure
        pair = pair_hosts(top.id)
        legs = self._legs(topo, top.id.split("->") if top.kind == "path" else pair, cands, now)
        if len(legs) < 2:
            return f
        bases = {leg: base for leg in legs if leg.ttl >= 2
                 for base in [self._baseline(topo, leg)] if base is not None}
        for leg in [*legs, *dict.fromkeys(b for b in bases.values() if b not in legs)]:
            st = self.legs.setdefault(leg, _Rounds())
            # an answer lost on the way (agent restarted) holds a leg for 3 rounds at most
            gap = ROUND_S * (0.5 + random.Random(f"{leg}|{st.n}").random())
            if now - st.asked >= (3 * ROUND_S if st.pending else gap):
                st.asked = now
                st.n += 1
                st.pending = self.measurer.measure(leg, MEASURE_COUNT, now)
        crossed = {leg: leg_links(topo, leg) for leg in legs}
        verdict = self._verdict(cands, crossed, bases)
        if verdict is None:
            return f
        cable, signal = verdict
        # the belief in the tie as a whole: its top suspect (the path, else one of the tied
        # links) holds one candidate's part of it, a host pair (a hang's) all of it
        share = min(0.99, top.confidence * (1 if pair else len(cands)))
        conf = share * PROBE_ODDS / (share * PROBE_ODDS + 1.0 - share)
        lk = topo.links[cable]
        dirs = sorted(d.partition("=>")[2] for d in cands[cable]) if signal != "down" else []
        f.suspects = [Suspect("link", cable, None, None, conf)] + [
            Suspect(s.kind, s.id, s.host, s.rank, s.confidence * (1.0 - conf))
            for s in f.suspects if s.kind != "path" and s.id != cable][:3]
        f.aliases = tuple(a for a in f.aliases if a != f"link:{cable}")
        f.evidence["aliases"] = list(f.aliases)  # the named link is no alias of itself
        f.evidence["direction"] = f"towards {dirs[0]}" if len(dirs) == 1 else "both"
        f.evidence["probe"] = {"named": cable, "signal": signal, "legs": [
            self._describe(leg, crossed[leg], cands, bases.get(leg)) for leg in legs]}
        f.summary = renamed(f.summary, f.suspects[0], self.confidence)
        if signal == "down":
            leaf, via = (lk.a, lk.b) if topo.switches[lk.a].tier == "leaf" else (lk.b, lk.a)
            f.summary += (f"; measured: {leaf} no longer forwards to {via} (every port's hop "
                          f"answered from another switch), the other candidates' leaves do")
        else:
            f.summary += (f"; measured: only the legs crossing {lk.id} "
                          f"({f.evidence['direction']}) are "
                          f"{'lossy' if signal == 'loss' else 'slow'}")
        return f

    def _legs(self, topo: Topology, ends: list[str], cands: dict[str, frozenset[str]],
              now: float) -> list[Leg]:
        """One leg per candidate: from a NIC under the candidate's leaf whose host this
        aggregator routes (`_nic_under`), stopping at its spine (fabric) or leaf (access
        cable); legs crossing every candidate separate nothing. Then a control leg wherever a
        leg has no other of its TTL to be compared with (`_control`)."""
        legs: list[Leg] = []
        leaves = {sw for cable in cands for sw in (topo.links[cable].a, topo.links[cable].b)
                  if sw in topo.switches and topo.switches[sw].tier == "leaf"}
        # NICs whose own access cable is a candidate: a fabric leg from one crosses both
        cabled = {end for cable in cands for end in (topo.links[cable].a, topo.links[cable].b)
                  if "/" in end}
        for cable in cands:
            lk = topo.links[cable]
            sa, sb = topo.switches.get(lk.a), topo.switches.get(lk.b)
            if sa is not None and sb is not None:
                tiers = {sa.tier: lk.a, sb.tier: lk.b}
                leaf, via, ttl = tiers.get("leaf"), tiers.get("spine"), 2
                if leaf is None or via is None:
                    continue  # a three-tier fabric's upper links: not measured
                src = self._nic_under(topo, leaf, ends, cabled)
            else:
                src, via, ttl = (lk.a, lk.b, 1) if "/" in lk.a else (lk.b, lk.a, 1)
                if not self._asks(src.partition("/")[0]):
                    src = None  # an access cable is measured from its own host only
            if src is None:
                if now - self._unasked_at.get(cable, -1e18) >= ROUND_S:
                    self._unasked_at[cable] = now
                    self.unasked += 1
                continue
            dst = next((e for e in ends if e.partition("/")[0] != src.partition("/")[0]),
                       ends[-1] if ends else self._beyond(topo, src, leaves))
            if dst is None:
                continue
            leg = Leg(src, self._nic(topo, dst) or dst, ttl, via)
            links = leg_links(topo, leg)
            if leg not in legs and not all(links & c for c in cands.values()):
                legs.append(leg)
        for leg in list(legs):
            if not any(o.ttl == leg.ttl for o in legs if o != leg):
                ctl = self._control(topo, leg, cands, cabled)
                if ctl is not None and ctl not in legs:
                    legs.append(ctl)
        return legs

    def _control(self, topo: Topology, leg: Leg, cands: dict[str, frozenset[str]],
                 cabled: set[str]) -> Leg | None:
        """A leg like `leg` that crosses no candidate: from the same NIC to another spine
        (TTL 2), or from another NIC under the same leaf (TTL 1). RTT votes only against legs
        of its TTL (a TTL-2 round trip is a hop longer) and loss against the other legs' own:
        a lab tie of a slow fabric link and a host's access cable had one leg of each TTL and
        no vote at all (its leg to the spine at 43 ms p90, the other at 0.15 ms)."""
        host, _, dev = leg.src.partition("/")
        h = topo.hosts.get(host)
        nic = h.nic(dev) if h else None
        if nic is None:
            return None
        if leg.ttl >= 2:
            up = {lk.other(nic.leaf) for lk in topo.adjacency().get(nic.leaf, ())}
            spines = sorted(sw for sw in up
                            if sw in topo.switches and topo.switches[sw].tier == "spine")
            options = [Leg(leg.src, leg.dst, leg.ttl, sp) for sp in spines if sp != leg.via]
        else:
            options = [Leg(f"{o.name}/{n.name}", leg.dst, 1, nic.leaf)
                       for o in topo.hosts.values() if o.name != host and self._asks(o.name)
                       for n in o.nics if n.leaf == nic.leaf
                       and f"{o.name}/{n.name}" not in cabled]
        return next((o for o in options
                     if not any(leg_links(topo, o) & c for c in cands.values())), None)

    @staticmethod
    def _baseline(topo: Topology, leg: Leg) -> Leg | None:
        """The TTL-1 leg from `leg`'s NIC to its own leaf: the RTT its access cable adds. Legs
        of one TTL from different NICs differ by their access cables too (lab run X: a leg
        from a host whose cable queued the ring's traffic, 5.0 ms p90 against 0.22, named a
        healthy fabric link)."""
        host, _, dev = leg.src.partition("/")
        h = topo.hosts.get(host)
        nic = h.nic(dev) if h else None
        return Leg(leg.src, leg.dst, 1, nic.leaf) if nic is not None else None

    @staticmethod
    def _beyond(topo: Topology, src: str, avoid: set[str]) -> str | None:
        """A NIC under another leaf than `src`'s: a leg's datagrams must leave the leaf (their
        hop at the TTL answers; the destination only sets the 5-tuple). Under none of the
        `avoid` leaves (the candidates') where there is one: the routes towards a down
        cable's far leaf are withdrawn from its spine everywhere, and a leg towards it would
        find no port to the spine from any leaf."""
        host, _, dev = src.partition("/")
        h = topo.hosts.get(host)
        nic = h.nic(dev) if h else None
        if nic is None:
            return None
        other = [(n.leaf in avoid, f"{o.name}/{n.name}") for o in topo.hosts.values()
                 if o.name != host for n in o.nics if n.leaf != nic.leaf]
        return min(other, key=lambda x: x[0], default=(False, None))[1]

    @staticmethod
    def _nic(topo: Topology, end: str) -> str | None:
        host, _, dev = end.partition("/")
        h = topo.hosts.get(host)
        if h is None or not h.nics:
            return None
        return f"{host}/{(h.nic(dev) or h.nics[0]).name}" if dev else f"{host}/{h.nics[0].name}"

    def _asks(self, host: str) -> bool:
        return self.routed is None or self.routed(host)

    def _nic_under(self, topo: Topology, leaf: str, ends: list[str],
                   avoid: set[str]) -> str | None:
        """A NIC under `leaf` on a host this aggregator routes: one whose access cable is no
        candidate (`avoid`) before one whose is, as its leg then crosses the fabric candidate
        alone (a lab run tied a slow fabric link with one host's access cable, took that
        host's NIC and measured nothing: its leg crossed both); the path's own end before
        other hosts'."""
        found: list[str] = []
        for e in ends:
            host, _, dev = e.partition("/")
            h = topo.hosts.get(host)
            found += [f"{host}/{n.name}" for n in (h.nics if h and self._asks(host) else ())
                      if n.leaf == leaf and (not dev or n.name == dev)]
        found += [f"{h.name}/{n.name}" for h in topo.hosts.values() if self._asks(h.name)
                  for n in h.nics if n.leaf == leaf]
        return min(found, key=lambda nic: nic in avoid, default=None)

    def _verdict(self, cands: dict[str, frozenset[str]], crossed: dict[Leg, frozenset[str]],
                 bases: dict[Leg, Leg]) -> tuple[str, str] | None:
        """(cable, down | loss | rtt) when exactly one candidate agrees with every leg that
        votes."""
        for signal, states in (("down", self._reach_states(crossed)),
                               ("loss", self._loss_states(crossed)),
                               ("rtt", self._rtt_states(crossed, bases))):
            if "bad" not in states.values():
                continue
            fits = [c for c, comps in cands.items()
                    if all(s is None or (s == "bad") == bool(crossed[leg] & comps)
                           for leg, s in states.items())]
            if len(fits) == 1:
                return fits[0], signal
        return None

    def _rounds(self, leg: Leg) -> list[LegResult]:
        return [r for _, r in self._timed(leg)]

    def _timed(self, leg: Leg) -> list[tuple[float, LegResult]]:
        st = self.legs.get(leg)
        return list(st.rounds) if st else []

    def _loss_states(self, crossed: dict[Leg, frozenset[str]]) -> dict[Leg, str | None]:
        tally = {}
        for leg in crossed:
            rs = self._timed(leg)
            sent = sum(r.sent for _, r in rs)
            lost = sum(r.sent - r.answered for _, r in rs)
            when = [t for t, r in rs if r.answered < r.sent]
            persistent = len(when) >= MIN_ROUNDS and when[-1] - when[0] >= HOLD_S
            tally[leg] = (len(rs), sent, lost, persistent)
        def others(leg: Leg) -> float:  # what the other measured legs lose: the background
            # these agents and switches give (the lab: a healthy leg lost 1 of 400 a round)
            got = [(t[1], t[2]) for o, t in tally.items() if o != leg and t[0] >= MIN_ROUNDS]
            return sum(lo for _, lo in got) / max(1, sum(se for se, _ in got))

        bad = {leg for leg, (n, sent, lost, persistent) in tally.items()
               if persistent and lost >= MIN_LOST
               and _poisson_sf(lost, sent * max(BACKGROUND_LOSS, others(leg))) < P_LOSSY}
        if not bad:
            return dict.fromkeys(crossed)
        # Clean: had it crossed the lossy component it would lose at the lossy legs' rate, so
        # of the datagrams it and they lost together, its share would follow its share of the
        # datagrams sent; it lost too few of them (the exact conditional test of two Poisson
        # rates). A bound on that rate and then a test at it needed ~10 losses against none
        # where this needs 7 (the adversarial corpus: a link at 0.36 % named after 42 s, its
        # host's other leg waiting to vote clean).
        lost = sum(tally[leg][2] for leg in bad)
        sent = sum(tally[leg][1] for leg in bad)
        out: dict[Leg, str | None] = {}
        for leg, (n, s, lo, _) in tally.items():
            clean = n >= MIN_ROUNDS and _binom_cdf(lo, lo + lost, s / (s + sent)) < P_CLEAN
            out[leg] = "bad" if leg in bad else "good" if clean else None
        return out

    def _reach_states(self, crossed: dict[Leg, frozenset[str]]) -> dict[Leg, str | None]:
        """A leg bad whose last MIN_ROUNDS rounds all answered from other switches: its leaf
        no longer forwards to `via` (the cable is down: its own leaf drops a dead next hop at
        once, while the other leaves' traffic towards that leaf still blackholes at the spine
        until the routes are withdrawn; lab: connections of one leaf pair through a down
        cable tie its two ends). Good whose last round reached `via`."""
        out: dict[Leg, str | None] = dict.fromkeys(crossed)
        for leg in crossed:
            st = self.legs.get(leg)
            if st is None:
                continue
            reached = st.rounds[-1][0] if st.rounds else -math.inf
            gone = st.unreached[-1] if st.unreached else -math.inf
            if reached > gone:
                out[leg] = "good"
            elif len(st.unreached) >= MIN_ROUNDS and st.unreached[-MIN_ROUNDS] > reached:
                out[leg] = "bad"
        return out

    def _p90(self, leg: Leg, high: bool = False) -> float | None:
        """A leg's p90 RTT over its rounds once they outlast a burst (above): their lower
        median, or with fewer than RTT_ROUNDS their lowest; `high`: their upper median or
        highest (what a baseline is taken as: it may only keep a leg from voting)."""
        timed = [(t, r.rtt_p90_ms) for t, r in self._timed(leg) if r.rtt_p90_ms is not None]
        n = len(timed)
        if n < RTT_ROUNDS and (n < MIN_ROUNDS or timed[-1][0] - timed[0][0] < HOLD_S):
            return None
        xs = sorted(v for _, v in timed)
        k = (n - 1) // 2 if n >= RTT_ROUNDS else 0
        return xs[n - 1 - k] if high else xs[k]

    def _rtt_states(self, crossed: dict[Leg, frozenset[str]],
                    bases: dict[Leg, Leg]) -> dict[Leg, str | None]:
        """A leg bad whose p90 is RTT_RATIO times and RTT_MIN_MS above the best other leg of
        its TTL's, and as far above its own NIC's TTL-1 leg's (`bases`: the hop, not its
        access cable, adds it); good within RTT_CLEAN of the best."""
        p90 = {leg: v for leg in crossed for v in [self._p90(leg)] if v is not None}
        out: dict[Leg, str | None] = dict.fromkeys(crossed)
        for leg, v in p90.items():
            peers = [w for o, w in p90.items() if o.ttl == leg.ttl and o != leg]
            if not peers:
                continue
            best = min(peers)
            # a baseline never answered (a replay of a run that did not ask for it) is none
            base = self._p90(bases[leg], high=True) if leg in bases and \
                self._rounds(bases[leg]) else 0.0
            if v >= RTT_RATIO * best and v - best >= RTT_MIN_MS:
                if base is not None and v >= RTT_RATIO * base and v - base >= RTT_MIN_MS:
                    out[leg] = "bad"
            elif v <= RTT_CLEAN * min(peers + [v]):
                out[leg] = "good"
        return out

    def _describe(self, leg: Leg, links: frozenset[str], cands: dict[str, frozenset[str]],
                  base: Leg | None) -> dict[str, Any]:
        rs = self._rounds(leg)
        p90 = sorted(r.rtt_p90_ms for r in rs if r.rtt_p90_ms is not None)
        out = {"src": leg.src, "ttl": leg.ttl, "via": leg.via, "rounds": len(rs),
               "sent": sum(r.sent for r in rs),
               "lost": sum(r.sent - r.answered for r in rs),
               "rtt_p90_ms": round(p90[(len(p90) - 1) // 2], 3) if p90 else None,
               "crosses": sorted(c for c, comps in cands.items() if links & comps)}
        if base is not None:
            b = self._p90(base, high=True)
            out["access_p90_ms"] = None if b is None else round(b, 3)
        return out
