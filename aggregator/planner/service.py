"""C4P inside the aggregator: flows from reports, paths from probes, link health from C4D
incidents, plans out as `plan` frames, `plan_result` back (docs/planning.md).

Fed by ingest like diagnosis (`observe`, `tick`); frames for agents wait in `outbox` until the
server sends them. The API thread reads `view()` and calls `apply()` under the aggregator's
lock.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import numpy as np

from c4.core.topology import Topology, endpoint
from c4.core.wire import Frame
from c4.core.wire.kinds import PROBE_SPORTS_MAX

from ..schema import migrate
from . import solver
from .demand import Demand, elastic
from .config import PlanningConfig
from .model import Built, Flow, Health, Model, choose_ports, path_class
from .pathmap import PathMap

ROCE_PORTS = (0xC000, 0xFFFF)
LINK_DOWN = ("hw_link_flap", "hw_nic_down")  # incident classes that take a link out
FLOW_TTL_S = 60.0  # a flow no report mentioned for this long is gone
PORTS_S = 0.005  # of a re-plan's budget, kept for choosing ports and publishing


@dataclass
class Proposal:
    built: Built
    result: solver.Result
    ports: dict[int, int]  # flow index -> source port, for the moved flows
    current_util: float | None
    made: float
    reason: str
    seq: int = 0  # the order proposals were prepared in
    replan: bool = False
    # of the gain in max utilisation, what the noise in the measured demands could explain
    # (periodic proposals with every current path known)
    margin: float | None = None
    # flows planned with the demand their NICs allow (demand.elastic): key -> demand
    held_back: dict[Hashable, float] = field(default_factory=dict)

    def gain_needed(self, min_gain: float) -> float | None:
        """What a periodic plan must lower the max utilisation by to be applied on its
        own: the noise margin plus `min_gain` of the current maximum."""
        if self.current_util is None or self.margin is None:
            return None
        return self.margin + min_gain * self.current_util


@dataclass
class Job:
    """What `Planner.solve` needs, taken under the aggregator's lock by `prepare`."""

    built: Built
    now: float
    reason: str
    replan: bool
    seq: int
    t0: float  # perf_counter when prepared: a re-plan's budget counts from it
    target: float  # the utilisation a re-plan restores
    noise: np.ndarray | None = None  # per planned flow: Demand.noise (full plans)
    # planned flows a full link holds back, with their demand (demand.elastic); a re-plan's
    # come from the last full plan, a full plan's are estimated in `solve`
    held_back: dict[Hashable, float] | None = None


@dataclass
class Applied:
    id: str
    created: float
    reason: str
    assignments: dict[str, dict[str, Any]]  # key(host, id) -> what was sent (+ host)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> applied/failed

    @staticmethod
    def key(host: str, flow_id: str) -> str:
        """Assignment ids are the agent's (QP numbers repeat across hosts): one plan tells two
        hosts' QP 100 apart by host; host names never hold '/'."""
        return f"{host}/{flow_id}"


ATTRIBUTED = 0.5  # of a port's transmitted bytes its QPs' processes must account for

# (communicator, rank) -> bytes that rank sent over its last report per peer host; None when
# a peer is not placed (Diagnosis.sent_to_hosts: diagnosis parses the nccl section first)
SentToHosts = Callable[[str, int], "dict[str, int] | None"]


class _Sent:
    """One NCCL process's bytes sent per peer host over a report's interval (all its
    ranks), whether every peer was placed, and its job."""

    __slots__ = ("to", "placed", "job")

    def __init__(self) -> None:
        self.to: dict[str, int] = {}
        self.placed = True
        self.job: str | None = None


class Planner:
    def __init__(self, topology: Topology, cfg: PlanningConfig, db: sqlite3.Connection,
                 log: logging.Logger | None = None, name: str = "aggregator",
                 incidents: Callable[[], list[dict[str, Any]]] | None = None,
                 sent_to_hosts: SentToHosts | None = None) -> None:
        self.topo = topology
        self.cfg = cfg
        self.db = db
        self.log = log or logging.getLogger("c4.aggregator.planner")
        self.name = name
        self.incidents = incidents or (lambda: [])
        self.sent_to_hosts = sent_to_hosts
        migrate(db)
        # kept between plans: candidates per endpoint pair, the optimiser's last state
        self.model = Model(topology, cfg.suspect_factor)
        self.engine = solver.Engine()
        self.pathmap = PathMap(cfg.path_ttl_s)
        self.health = Health()
        self.flows: dict[str, dict[str, Flow]] = {}  # host -> flow id -> flow
        self.demand: dict[tuple[str, str], Demand] = {}  # (host, flow id) -> measured rates
        # what the model is handed: (host, flow id) -> the flow with the port in effect, and
        # the keys changed since the last build (every change to `flows` or `in_effect`)
        self.live: dict[tuple[str, str], Flow] = {}
        self.touched: set[tuple[str, str]] = set()
        self.gids: dict[str, str] = {}  # GID -> endpoint
        self.addrs: dict[str, str] = {}  # IP -> endpoint
        self.ep_addr: dict[str, str] = {}  # endpoint -> IP
        self.outbox: list[tuple[str, str, dict[str, Any]]] = []  # (host, kind, body)
        # last probe of (src, dst, path class, port): None for the pair's random ports, a port
        # for a flow's own
        self.asked: dict[tuple[str, str, str, int | None], float] = {}
        self.asked_pruned = 0.0
        self.pending: dict[str, dict[str, tuple[str, str, str]]] = {}  # probe id -> id -> key
        self.host_probe: dict[str, float] = {}
        self.tokens = cfg.probe_sports_per_s
        self.tokens_at = 0.0
        self.proposal: Proposal | None = None
        self.seq = 0  # proposals prepared
        self.solving = threading.Lock()  # the optimiser: tick and the API may both plan
        self.planned_util = 0.0  # what the last full proposal reached: a re-plan's target
        self.applied: Applied | None = None
        self.in_effect: dict[tuple[str, str], int] = {}  # (host, flow id) -> port a
        # plan_result confirmed (QP ids are per host)
        self.epoch = int(db.execute("SELECT COALESCE(MAX(epoch), 0) FROM plans").fetchone()[0])
        self.next_plan = 0.0
        self.deferred: set[str] = set()  # links whose health changed while settling
        self.rng = random.Random(0)
        # planned flows the last full plan found held back by a full link: their demand then
        self.held_back: dict[Hashable, float] = {}
        self.stats = {"probes_sent": 0, "probe_results": 0, "paths_learned": 0,
                      "paths_unresolved": 0, "plans_applied": 0, "replans": 0}
        for h in topology.hosts.values():
            for n in h.nics:
                if n.addr:
                    self.addrs[n.addr] = endpoint(h.name, n.dev)
                    self.ep_addr.setdefault(endpoint(h.name, n.dev), n.addr)

    # -- inputs -----------------------------------------------------------------------------
    def observe(self, frame: Frame, now: float) -> None:
        try:
            if frame.kind == "hello":
                self._hello(frame.host, frame.body)
            elif frame.kind == "report":
                self._report(frame.host, frame.body, now)
            elif frame.kind == "probe_result":
                self._probe_result(frame.host, frame.body, now)
            elif frame.kind == "plan_result":
                self._plan_result(frame.host, frame.body, now)
        except (KeyError, TypeError, ValueError) as exc:  # one odd frame loses only itself
            self.log.warning("planner skipped a %s from %s: %r", frame.kind, frame.host, exc)

    def _hello(self, host: str, body: dict[str, Any]) -> None:
        th = self.topo.hosts.get(host)
        if th is None:
            return
        for nic in body.get("nics", []):
            for p in nic.get("ports", []):
                ep = endpoint(host, nic["dev"])
                for gid in p.get("gids", []):
                    self.gids[gid] = ep
        for nd in body.get("netdevs", []):
            nic = self.topo.nic_by_netdev(host, nd["name"])
            if nic is None:
                continue
            for a in nd.get("addrs", []):
                ip = _bare(a)
                self.addrs[ip] = endpoint(host, nic.dev)
                self.ep_addr.setdefault(endpoint(host, nic.dev), ip)

    def _report(self, host: str, body: dict[str, Any], now: float) -> None:
        """Reports list changed QPs and connections: update those, drop the destroyed and
        closed ones; the rest stay until `FLOW_TTL_S` without a mention."""
        if host not in self.topo.hosts:
            return
        flows = self.flows.setdefault(host, {})
        rdma = body.get("rdma") or {}
        # each port's transmit rate, smoothed over the last reports (Demand)
        tx: dict[tuple[str, int], float] = {}
        sent_bytes: dict[tuple[str | None, int], float] = {}  # what the port sent this interval
        for pt in rdma.get("ports", []):
            rate = pt.get("rates", {}).get("port_xmit_bytes")
            if rate is not None:
                tx[(pt["dev"], pt["port"])] = self._measured(
                    (host, f"port:{pt['dev']}:{pt['port']}"), float(rate))
                sent_bytes[(pt["dev"], pt["port"])] = float(rate) * float(body["interval"])
        sent = self._sent(body.get("nccl"))
        vq = body.get("verbs_qp")
        if vq is not None:
            # the uprobe sees no device: the kernel's QP list (same lqpn and pid) names it,
            # and a host with one RDMA device needs none
            devs = {(n["lqpn"], n["pid"]): n["dev"] for n in vq.get("netlink", [])}
            only = {n.dev for n in self.topo.hosts[host].nics}
            qps = [(q, devs.get((q["lqpn"], q["pid"])) or (next(iter(only)) if len(only) == 1
                                                           else None))
                   for q in vq.get("qps", []) if q["qp_type"] in ("RC", "UC")]
            # indices, not the (dict, dev) pairs: membership stays O(1) per QP
            live = {i for i, (q, dev) in enumerate(qps) if dev and not q["destroyed"] and
                    q["state"] == "RTS" and q.get("dgid") and q.get("sport") is not None}
            shares = self._qp_shares(qps, live, sent, sent_bytes)
            for i, (q, dev) in enumerate(qps):
                fid = f"qp:{dev}:{q['lqpn']}"
                flows.pop(fid, None)
                self.touched.add((host, fid))
                dst = self.gids.get(q.get("dgid") or "")
                if dev is None or i not in live or dst is None or \
                        dst.partition("/")[0] == host:
                    continue
                rate = tx.get((dev, q["port"]))
                # the QP's share of its port's transmit rate; 1 when unmeasured
                share = shares[i]
                demand = rate * share if rate else 1.0
                pj = sent.get(q["pid"]) if sent else None
                flows[fid] = Flow(fid, host, endpoint(host, dev), dst, "roce", q["sport"],
                                  demand, job=pj.job if pj else None,
                                  meta={"dev": dev, "lqpn": q["lqpn"], "rqpn": q["rqpn"],
                                        "pid": q["pid"], "seen": now,
                                        "rate_of": (f"port:{dev}:{q['port']}", share)})
        tcp = body.get("tcp_flows")
        if tcp is not None:
            if tcp.get("refresh"):
                for fid in [k for k, f in flows.items() if f.proto == "tcp"]:
                    del flows[fid]
                    self.touched.add((host, fid))
            for f in tcp.get("flows", []):
                fid = _ident(f"tcp:{_bare(f['saddr'])}:{f['sport']}:{_bare(f['daddr'])}:"
                             f"{f['dport']}")
                flows.pop(fid, None)
                self.touched.add((host, fid))
                if f["closed"] or f["state"] != "ESTABLISHED":
                    self.demand.pop((host, fid), None)  # a reconnect on this 4-tuple is new
                    continue
                src, dst = self.addrs.get(_bare(f["saddr"])), self.addrs.get(_bare(f["daddr"]))
                if src is None or dst is None or src.partition("/")[0] != host or \
                        dst.partition("/")[0] == host:
                    continue
                rate = self._measured((host, fid), max(float(f["bytes_acked_rate"]), 1.0))
                meta = {"pid": f["pid"], "src": _bare(f["saddr"]), "dst": _bare(f["daddr"]),
                        "seen": now}
                if f.get("accepted"):
                    meta["accepted"] = True
                flows[fid] = Flow(fid, host, src, dst, "tcp", f["sport"], rate, f["dport"],
                                  f.get("job"), meta=meta)
        for fid in [k for k, f in flows.items() if now - f.meta["seen"] > FLOW_TTL_S]:
            del flows[fid]
            self.touched.add((host, fid))

    def _sent(self, nccl: dict[str, Any] | None) -> dict[int, _Sent] | None:
        """What each NCCL process of this report sent to each peer host over the interval:
        its ranks as the report lists them, their bytes and peers' hosts from diagnosis."""
        if nccl is None or self.sent_to_hosts is None:
            return None
        out: dict[int, _Sent] = {}
        for c in nccl["comms"]:
            pid = c.get("pid")
            if pid is None:
                continue
            ps = out.setdefault(pid, _Sent())
            ps.job = ps.job or c.get("job")
            to = self.sent_to_hosts(c["comm"], c["rank"])
            if to is None:
                ps.placed = False
                continue
            for h, b in to.items():
                ps.to[h] = ps.to.get(h, 0) + b
        return out

    def _qp_shares(self, qps: list[tuple[dict[str, Any], str | None]], live: set[int],
                   sent: dict[int, _Sent] | None,
                   sent_bytes: dict[tuple[str | None, int], float]) -> dict[int, float]:
        """Each live QP's share of its port's transmit rate. A port's NIC counts its bytes,
        not its QPs': the share is what the QP's process sent to the QP's destination host
        (NCCL's per-peer bytes), divided over that process's QPs to that host. A ring rank's
        QPs to the previous rank carry only receive credits, and an equal split gave them
        half of its port. The QPs split the port equally where one of them has no bytes to
        go by (no plugin, a peer rank no report placed yet), where they sent nothing, or
        where their processes account for less than `ATTRIBUTED` of what the port sent:
        with PXN, NCCL's proxy in another process sends over this process's QPs, and that
        process's plugin does not count those bytes (docs/plugin.md)."""
        dst_host = {i: self.gids[qps[i][0]["dgid"]].partition("/")[0] for i in live
                    if qps[i][0]["dgid"] in self.gids}
        per_port: dict[tuple[str | None, int], list[int]] = {}
        for i in live:
            q, dev = qps[i]
            per_port.setdefault((dev, q["port"]), []).append(i)
        n_to: dict[tuple[int, str], int] = {}  # (pid, peer host) -> QPs
        for i, peer in dst_host.items():
            n_to[(qps[i][0]["pid"], peer)] = n_to.get((qps[i][0]["pid"], peer), 0) + 1
        out: dict[int, float] = {}
        for port, members in per_port.items():
            w = {}
            for i in members:
                ps = sent.get(qps[i][0]["pid"]) if sent else None
                if ps is None or not ps.placed or i not in dst_host:
                    break
                w[i] = ps.to.get(dst_host[i], 0) / n_to[(qps[i][0]["pid"], dst_host[i])]
            total = sum(w.values())
            if len(w) < len(members) or total <= 0 or \
                    total < ATTRIBUTED * sent_bytes.get(port, 0.0):
                out.update(dict.fromkeys(members, 1.0 / len(members)))
            else:
                out.update((i, x / total) for i, x in w.items())
        return out

    def _measured(self, key: tuple[str, str], rate: float) -> float:
        d = self.demand.get(key)
        if d is None:
            d = self.demand[key] = Demand(self.cfg.demand_window)
        return d.add(rate)

    def _noise(self, key: tuple[str, str], fl: Flow) -> float:
        """Demand.noise of a planned flow (a QP's share of its port's)."""
        rate_of = fl.meta.get("rate_of")
        d = self.demand.get((fl.host, rate_of[0]) if rate_of else key)
        if d is None:
            return fl.demand
        return d.noise() * rate_of[1] if rate_of else d.noise()

    def _probe_result(self, host: str, body: dict[str, Any], now: float) -> None:
        asked = self.pending.pop(body["probe_id"], {})
        self.stats["probe_results"] += 1
        for r in body["results"]:
            key = asked.get(r["id"])
            if key is None or r.get("error"):
                continue
            src, dst, pclass = key
            hops = list(r["hops"])
            links = self.topo.links_from_hops(src, dst, hops) if r["reached"] else None
            if links is None:
                self.stats["paths_unresolved"] += 1
                continue
            self.pathmap.learn(src, dst, pclass, r["sport"], links, now)
            self.stats["paths_learned"] += 1

    def _plan_result(self, host: str, body: dict[str, Any], now: float) -> None:
        ap = self.applied
        if ap is None or body["plan_id"] != ap.id:
            return
        for a in body["applied"]:
            k = Applied.key(host, a["id"])
            if k in ap.assignments:
                ap.results[k] = {"ok": True, "sport": a["sport"], "at": now}
                self.in_effect[(host, a["id"])] = a["sport"]
                self.touched.add((host, a["id"]))
        for a in body["failed"]:
            k = Applied.key(host, a["id"])
            if k in ap.assignments:
                ap.results[k] = {"ok": False, "reason": a["reason"], "at": now}
        self.db.execute("UPDATE plans SET results=? WHERE id=?",
                        (json.dumps(ap.results, sort_keys=True), ap.id))

    # -- time -------------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        if not self.cfg.enabled:
            return
        # a link incident is answered first: probing and expiry can wait for the re-plan
        if not self.react(now) and now >= self.next_plan:
            self.next_plan = now + self.cfg.interval_s
            p = self.propose(now, "periodic")
            if self.cfg.auto_apply and p is not None and not self._settling(now) and \
                    self._gains(p):
                self.apply(now)
        self.pathmap.expire(now)
        self._probe(now)
        self._settle()

    def _settle(self) -> None:
        """Set up what a re-plan of an unapplied plan starts from, once the plan is out
        (`Engine.settle`): never waiting while the API plans outside the aggregator's lock."""
        if self.solving.acquire(blocking=False):
            try:
                self.engine.settle()
            finally:
                self.solving.release()

    def react(self, now: float) -> bool:
        """Link health from C4D's open incidents; when it changed, the re-plan (applied
        with `auto_apply`). True when it changed."""
        t0 = time.perf_counter()  # the re-plan's budget counts from the incident
        was_down = self.health.down
        changed = self._update_health() | self.deferred
        if not changed or not self.cfg.replan_on_incident:
            return False
        if self._settling(now) and self.health.down == was_down:
            # slow/lossy only, while the last plan's reconnects settle: likely their own
            # stall; looked at again when the hold-down ends
            self.deferred = changed
            return False
        self.deferred = set()
        self.stats["replans"] += 1
        # flows on a down link must move; a slow or lossy link only weighs less, so that
        # re-plan is an optimisation like a periodic one, held to the same margin (lab: C4D
        # named leaf01's uplinks slow in turn under CPU starvation, and each re-plan
        # reconnected the ring for a gain it could not show)
        suspect_only = self.health.down == was_down
        p = self.propose(now, "link health changed: " + ", ".join(sorted(changed)),
                         replan=True, t0=t0, noise=suspect_only)
        if self.cfg.auto_apply and p is not None and p.result.moved and \
                (not suspect_only or self._gains(p)):
            self.apply(now)
        return True

    def _gains(self, p: Proposal) -> bool:
        """Whether `p` lowers the max utilisation by more than the noise in the measured
        demands explains plus `min_gain` (the current utilisation known)."""
        need = p.gain_needed(self.cfg.min_gain)
        return need is not None and p.current_util is not None and p.current_util > 0 and \
            bool(p.result.moved) and p.current_util - p.result.max_util >= need

    def _settling(self, now: float) -> bool:
        """Within `settle_s` of the last applied plan."""
        return self.applied is not None and now < self.applied.created + self.cfg.settle_s

    def host_silent(self, host: str, last_seen: float, now: float) -> None:
        self.touched.update((host, fid) for fid in self.flows.pop(host, {}))
        for key in [k for k in self.demand if k[0] == host]:
            del self.demand[key]

    def host_back(self, host: str, now: float) -> None:
        pass

    def _update_health(self) -> set[str]:
        """Link health from open incidents; returns the links whose state changed."""
        down: set[str] = set()
        suspect: dict[str, str] = {}
        for inc in self.incidents():
            if inc.get("state") == "resolved" or not self._localised(inc):
                continue
            links = self._links_of(inc["suspects"][0])
            if inc["class"] in LINK_DOWN:
                down.update(links)
            elif inc["class"] in ("comm_slow", "comm_hang"):
                for lk in links:
                    suspect[lk] = f"incident {inc['id']}: {inc['class']}"
        changed = (down ^ self.health.down) | (set(suspect) ^ set(self.health.suspect))
        # the fabric may route around a link that went down differently now; a slow or
        # lossy link still carries what it did (and its flows' current paths stay known, so
        # a re-plan can show what it gains)
        for lk in down - self.health.down:
            self.pathmap.forget_link(lk)
        if changed:
            self.asked.clear()  # flows that lost their known ports are probed again at once
        self.health = Health(down, suspect)
        return changed

    def _localised(self, inc: dict[str, Any]) -> bool:
        """Whether C4D named one link or NIC: the incident is localised (its top held for
        `localise_persist` ticks), the top suspect is a link or NIC at `suspect_confidence`
        or more, and no other component explains the evidence as well. A path finding (its
        connections cross several candidates alike: a `path` suspect first, or candidates
        tied) says nothing about a link until probes single one out. Not before C4D localises:
        moving the connections off a link whose finding has not yet held takes away the
        evidence that would confirm it (lab run O: re-planned on a flap's first tick, the
        reconnects' timeouts turned C4D's top elsewhere; a replay named nothing)."""
        sus = inc.get("suspects") or []
        if inc.get("localised") is None or not sus or sus[0].get("kind") not in ("link", "nic"):
            return False
        conf = sus[0].get("confidence", 0.0)
        return conf >= self.cfg.suspect_confidence and not any(
            s.get("confidence", 0.0) >= conf and s.get("id") != sus[0].get("id")
            for s in sus[1:])

    def _links_of(self, suspect: dict[str, Any]) -> list[str]:
        if suspect.get("kind") == "link" and suspect.get("id") in self.topo.links:
            return [suspect["id"]]
        if suspect.get("kind") == "nic":
            host, _, dev = str(suspect.get("id")).partition("/")
            h = self.topo.hosts.get(host)
            return [lid for n in (h.ports(dev) if h else []) for lid in self.topo.links
                    if self.topo.links[lid].a == endpoint(host, n.name)]
        return []

    # -- probing ----------------------------------------------------------------------------
    def _probe(self, now: float) -> None:
        """Ask the source hosts to trace the endpoint pairs whose known ports are too few,
        within the per-host and global rate limits."""
        self.tokens = min(self.cfg.probe_sports_per_s,
                          self.tokens + (now - self.tokens_at) * self.cfg.probe_sports_per_s)
        self.tokens_at = now
        for host, flows in sorted(self.flows.items()):
            if self.tokens <= 0:
                break  # the bucket may go into debt by one request; it refills first
            if now - self.host_probe.get(host, -1e18) < self.cfg.probe_host_interval_s:
                continue
            probes: list[dict[str, Any]] = []
            ids: dict[str, tuple[str, str, str]] = {}
            sports_total = 0
            by_key: dict[tuple[str, str, str], list[Flow]] = {}
            for fl in flows.values():
                by_key.setdefault((fl.src, fl.dst, fl.pclass), []).append(fl)
            for key, fls in by_key.items():
                fl = fls[0]
                dst_ip, src_ip = self.ep_addr.get(fl.dst), self.ep_addr.get(fl.src)
                if dst_ip is None:
                    continue
                known = self.pathmap.ports(*key, now)
                retry = now - self.cfg.probe_retry_s
                # the flows' own ports: the paths they take now, which a plan's gain is judged
                # from (a live TCP connection's is traced on its own 4-tuple, agent/probe.py)
                sports = sorted({f.sport for f in fls if f.sport is not None and
                                 f.sport not in known and
                                 self.asked.get((*key, f.sport), -1e18) < retry})[:64]
                own = list(sports)
                fill = len(known) < self.cfg.probe_ports and \
                    self.asked.get((*key, None), -1e18) < retry
                if fill:
                    lo, hi = ROCE_PORTS if fl.proto == "roce" else self.cfg.tcp_ports
                    while len(sports) < max(len(own), self.cfg.probe_ports - len(known)):
                        p = self.rng.randint(lo, hi)
                        if p not in known and p not in sports:
                            sports.append(p)
                if not sports:
                    continue
                if probes and sports_total + len(sports) > min(PROBE_SPORTS_MAX, self.tokens):
                    break
                pid = f"x{len(probes)}"
                probe: dict[str, Any] = {"id": pid, "proto": fl.proto, "dst": dst_ip,
                                         "sports": sports, "dev": fl.src.partition("/")[2],
                                         "dport": fl.dport}
                if src_ip:
                    probe["src"] = src_ip
                probes.append(probe)
                ids[pid] = key
                sports_total += len(sports)
                self.asked.update(((*key, sp), now) for sp in own)
                if fill:
                    self.asked[(*key, None)] = now
                if len(probes) >= 256:
                    break
            if probes:
                probe_id = f"probe-{int(now * 1000)}-{len(self.pending)}"
                self.pending[probe_id] = ids
                self.outbox.append((host, "probe", {"probe_id": probe_id, "probes": probes,
                                                    "reason": "flows without known paths"}))
                self.tokens -= sports_total
                self.host_probe[host] = now
                self.stats["probes_sent"] += 1
        while len(self.pending) > 1024:  # answers that never came
            self.pending.pop(next(iter(self.pending)))
        if now - self.asked_pruned > self.cfg.probe_retry_s:  # closed connections' ports
            self.asked_pruned = now
            self.asked = {k: at for k, at in self.asked.items()
                          if now - at < self.cfg.probe_retry_s}

    # -- C4D (aggregator/diagnosis/probes.py) -------------------------------------------------
    def learned_path(self, src: str, dst: str, now: float) -> tuple[str, ...] | None:
        """The one path the live flows NIC src -> NIC dst take, as probes learned it (C4D
        votes with it where the topology has none); None when unknown, or their ports take
        different paths. A pair without reported flows: the one path its probed ports take."""
        ports = [(fl.pclass, fl.sport) for fl in self.flows.get(src.partition("/")[0], {}).values()
                 if fl.src == src and fl.dst == dst and fl.sport is not None]
        paths = {self.pathmap.lookup(src, dst, pc, sp, now) for pc, sp in ports} if ports else \
            set(self.pathmap.ports(src, dst, "roce", now).values())
        return paths.pop() if len(paths) == 1 and None not in paths else None

    def port_path(self, src: str, dst: str, proto: str, dport: int, sport: int,
                  now: float) -> tuple[str, ...] | None:
        """The path one source port of src -> dst takes, as probes learned it: C4D places
        a connection on a planned port there, not on the NIC pair's default path."""
        return self.pathmap.lookup(src, dst, path_class(proto, dport), sport, now)

    def paths_version(self) -> tuple[Any, ...]:
        """Changes whenever port_path's answers may have: a path learned, forgotten or
        expired (the map's mark), a plan applied."""
        return self.pathmap.mark(), self.applied.id if self.applied else None

    def request_probe(self, src: str, dst: str, now: float) -> bool:
        """C4D asks for the paths of the flows src -> dst: they are traced at the next tick,
        ahead of the per-host interval and the retry wait, within the global rate limit.
        False when no live flow joins them (nothing to trace)."""
        host = src.partition("/")[0]
        keys = {(fl.src, fl.dst, fl.pclass) for fl in self.flows.get(host, {}).values()
                if fl.src == src and fl.dst == dst}
        for k in [k for k in self.asked if k[:3] in keys]:
            del self.asked[k]
        if keys:
            self.host_probe.pop(host, None)
        return bool(keys)

    # -- plans ------------------------------------------------------------------------------
    def live_flows(self) -> dict[tuple[str, str], Flow]:
        """Every flow by (host, id), a RoCE flow with the port a plan_result confirmed (its
        next report may still name the old one); updated for the touched keys only."""
        for key in self.touched:
            host, fid = key
            fl = self.flows.get(host, {}).get(fid)
            if fl is None:
                self.live.pop(key, None)
                self.demand.pop(key, None)
                continue
            port = self.in_effect.get(key)
            if port is not None and port != fl.sport and fl.proto == "roce":
                fl = Flow(fl.id, fl.host, fl.src, fl.dst, fl.proto, port, fl.demand,
                          fl.dport, fl.job, fl.meta)
            self.live[key] = fl
        return self.live

    def propose(self, now: float, reason: str, replan: bool = False,
                t0: float | None = None, noise: bool = False) -> Proposal | None:
        """Plan the live flows; `replan`: keep every flow whose path is still usable, within
        `replan_budget_s` from `t0` (perf_counter; default: here; building the input
        counts); `noise`: a re-plan's noise margin is wanted too (full plans always have it)."""
        job = self.prepare(now, reason, replan, t0, noise)
        return self.publish(self.solve(job)) if job is not None else None

    # the build allocates every flow's input: a full collection in it took a 16,384-GPU
    # re-plan to 0.7 s (the solve pauses the collector itself)
    @solver.without_gc
    def prepare(self, now: float, reason: str, replan: bool = False,
                t0: float | None = None, noise: bool = False) -> Job | None:
        """The optimiser's input from what the planner knows now (under the aggregator's
        lock: it reads flows, path map and health); None, and no proposal, when no flow has
        a known path."""
        t0 = time.perf_counter() if t0 is None else t0
        b = self.model.build(self.live_flows(), self.pathmap, self.health, now, self.touched)
        self.touched = set()
        self.seq += 1
        if b.inst is None:
            self.proposal = None
            return None
        held_back = None
        if self.cfg.elastic and replan:
            # the last full plan's estimate: a re-plan restores what that plan reached, from
            # the same demands, within `replan_budget_s` (estimating again took a 32,768-flow
            # re-plan from 81 to 224 ms: docs/planning.md)
            est = self.held_back
            b.inst = dataclasses.replace(b.inst, demand=np.fromiter(
                (est.get(k, x) for k, x in zip(b.keys, b.inst.demand.tolist())),
                dtype=np.float64, count=len(b.keys)))
            held_back = {k: est[k] for k in b.keys if k in est}
        noise_of = None if replan and not noise else np.fromiter(
            (self._noise(k, fl) for k, fl in zip(b.keys, b.flows)),  # type: ignore[arg-type]
            dtype=np.float64, count=len(b.flows))
        return Job(b, now, reason, replan, self.seq, t0, self.planned_util, noise_of,
                   held_back)

    # the split of a first plan's candidate lists allocates as the build does: with the
    # collector running it took a fresh aggregator's first proposal a quarter longer
    # (bench/planner's service_plan_ms, docs/benchmarks.md 2026-12-07)
    @solver.without_gc
    def solve(self, job: Job) -> Proposal:
        """A proposal for `job`. Reads nothing the aggregator's lock guards (the input is
        the job's own copy), so the API runs it outside that lock; the optimiser, whose state
        is kept between plans, is the planner's alone (`solving`)."""
        b = job.built
        assert b.inst is not None
        complete = min(b.current) >= 0
        held_back = job.held_back or {}
        with self.solving:
            if self.cfg.elastic and job.held_back is None:
                # the split is the engine's, kept between plans, which its state reuses
                demand, back = elastic(b.inst, b.current,
                                       [s[0] for s in self.engine.splits(b.inst.cand)],
                                       [fl.job for fl in b.flows])
                if job.noise is not None:
                    # as uncertain as the rate it came from: a young flow's estimate is all
                    # noise too (its ramp-up or stall alone never gets a plan applied)
                    job.noise = np.where(back, job.noise * demand /
                                         np.maximum(b.inst.demand, 1e-12), job.noise)
                b.inst = dataclasses.replace(b.inst, demand=demand)
                held_back = {b.keys[f]: float(demand[f]) for f in np.flatnonzero(back)}
            # the current placement's maximum, and its noise where a margin is wanted: one
            # pass over its paths for both
            cur = _busiest(b.inst, b.current, job.noise) if complete else None
            if job.replan:
                # restore the utilisation the last proposal or plan reached, moving little
                # what is left, less a margin for the ports and the proposal after it
                left = self.cfg.replan_budget_s - (time.perf_counter() - job.t0)
                r = self.engine.replan(b.inst, b.current, left - PORTS_S, job.target)
            else:
                r = self.engine.plan(b.inst, b.current, self.cfg.budget_s)
        margin = None
        if cur is not None and job.noise is not None:
            margin = cur[1] + _busiest(b.inst, r.assign, job.noise)[1]
        return Proposal(b, r, choose_ports(b, r.assign, r.moved),
                        cur[0] if cur is not None else None, job.now,
                        job.reason, job.seq, job.replan, margin, held_back)

    def publish(self, p: Proposal) -> Proposal:
        """`p` becomes the proposal unless one prepared later was published first (a
        re-plan while `p` was solved outside the lock)."""
        if self.proposal is not None and self.proposal.seq > p.seq:
            return self.proposal
        self.proposal = p
        if not p.replan:
            self.planned_util = p.result.max_util
            self.held_back = p.held_back
        return p

    def refresh(self, lock: Any, clock: Callable[[], float], reason: str,
                missing_only: bool = False) -> None:
        """Bring the proposal up to date (`missing_only`: only make one when there is none)
        for the API: the input is prepared and the result published under `lock` (the
        aggregator's), the optimiser runs outside it, so ingest is not held up for
        `budget_s`."""
        with lock:
            now = clock()
            want = self.proposal is None if missing_only else self.stale(now)
            job = self.prepare(now, reason) if want else None
        if job is not None:
            p = self.solve(job)
            with lock:
                self.publish(p)
            self._settle()  # outside the lock too, as the plan was

    def stale(self, now: float) -> bool:
        """Whether `view` would propose again (none, or older than `interval_s`)."""
        return self.proposal is None or now - self.proposal.made > self.cfg.interval_s

    def apply(self, now: float) -> dict[str, Any]:
        """Send the proposal's moves to the hosts that own the flows."""
        p = self.proposal or self.propose(now, "apply")
        if p is None:
            return {"plan_id": None, "assignments": 0, "hosts": [],
                    "reason": "nothing to plan (no flows with known paths)"}
        self.epoch += 1
        plan_id = f"plan-{self.epoch}"
        per_host: dict[str, list[dict[str, Any]]] = {}
        sent: dict[str, dict[str, Any]] = {}
        b = p.built
        for f in p.result.moved:
            fl = b.flows[f]
            port = p.ports[f]
            if port == fl.sport:
                continue
            a: dict[str, Any] = {"id": fl.id, "proto": fl.proto, "sport": port}
            if fl.sport is not None:
                a["old_sport"] = fl.sport
            for k in ("dev", "lqpn", "rqpn", "pid", "src", "dst"):
                if fl.meta.get(k) is not None:
                    a[k] = fl.meta[k]
            if fl.proto == "tcp":
                a["dport"] = fl.dport
            per_host.setdefault(fl.host, []).append(a)
            sent[Applied.key(fl.host, fl.id)] = {**a, "host": fl.host, "path": list(b.paths[f][p.result.assign[f]])}
        for host, assignments in sorted(per_host.items()):
            self.outbox.append((host, "plan", {"plan_id": plan_id, "assignments": assignments,
                                               "epoch": self.epoch, "reason": p.reason[:256]}))
        self.applied = Applied(plan_id, now, p.reason, sent)
        self.db.execute("INSERT INTO plans VALUES (?,?,?,?,?,?,?,?)", (
            plan_id, now, p.reason, self.epoch, p.current_util, p.result.max_util,
            json.dumps(sent, sort_keys=True), "{}"))
        self.stats["plans_applied"] += 1
        self.proposal = None
        return {"plan_id": plan_id, "assignments": len(sent), "hosts": sorted(per_host),
                "reason": p.reason}

    def take_outbox(self) -> list[tuple[str, str, dict[str, Any]]]:
        out, self.outbox = self.outbox, []
        return out

    # -- API --------------------------------------------------------------------------------
    def view(self, now: float, links: int = 20, moves: int = 200) -> dict[str, Any]:
        p = self.proposal if not self.stale(now) else self.propose(now, "requested")
        out: dict[str, Any] = {
            "enabled": self.cfg.enabled, "auto_apply": self.cfg.auto_apply,
            "flows": sum(len(v) for v in self.flows.values()),
            "pathmap": {"entries": len(self.pathmap), "probes_pending": len(self.pending)},
            "health": {"down": sorted(self.health.down), "suspect": self.health.suspect},
            "stats": dict(self.stats), "proposal": None, "last_plan": self._last_plan()}
        if p is None:
            return out
        b, r = p.built, p.result
        need = p.gain_needed(self.cfg.min_gain)
        reasons: dict[str, int] = {}
        for _, why in b.unplanned:
            reasons[why] = reasons.get(why, 0) + 1
        cur = _arc_util(b, b.current)
        new = _arc_util(b, r.assign)
        rows = []
        for a in sorted(set(cur) | set(new), key=lambda a: -max(cur.get(a, 0), new.get(a, 0)))[:links]:
            lid, fwd = b.arcs[a]
            lk = self.topo.links[lid]
            rows.append({"link": lid, "from": lk.a if fwd else lk.b, "to": lk.b if fwd else lk.a,
                         "gbps": lk.gbps, "kind": lk.kind, "current": round(cur.get(a, 0.0), 4),
                         "proposed": round(new.get(a, 0.0), 4),
                         "health": "down" if lid in self.health.down else
                         "suspect" if lid in self.health.suspect else "ok"})
        mv = []
        for f in r.moved[:moves]:
            fl = b.flows[f]
            mv.append({"flow": fl.id, "host": fl.host, "proto": fl.proto, "src": fl.src,
                       "dst": fl.dst, "from": fl.sport, "to": p.ports[f],
                       "from_path": list(b.paths[f][b.current[f]]) if b.current[f] >= 0 else None,
                       "to_path": list(b.paths[f][r.assign[f]])})
        out["proposal"] = {
            "reason": p.reason, "made": p.made, "planned": len(b.flows),
            "unplanned": len(b.unplanned), "unplanned_reasons": reasons,
            "held_back": len(p.held_back),
            "current_max_util": None if p.current_util is None else round(p.current_util, 4),
            "proposed_max_util": round(r.max_util, 4), "moved": len(r.moved),
            "noise_margin": None if p.margin is None else round(p.margin, 4),
            "auto_gain_needed": None if need is None else round(need, 4),
            "gains": self._gains(p),
            "plan_ms": round(r.seconds * 1e3, 2), "links": rows, "moves": mv}
        return out

    def _last_plan(self) -> dict[str, Any] | None:
        ap = self.applied
        if ap is None:
            return None
        failed = [{"host": k.partition("/")[0], "id": k.partition("/")[2],
                   "reason": r["reason"]} for k, r in ap.results.items() if not r["ok"]]
        return {"id": ap.id, "created": ap.created, "reason": ap.reason,
                "assignments": len(ap.assignments),
                "applied": sum(1 for r in ap.results.values() if r["ok"]),
                "failed": failed,
                "waiting": sorted(i for i in ap.assignments if i not in ap.results)[:100]}


def _busiest(inst: solver.Instance, assign: list[int],
             noise: np.ndarray | None) -> tuple[float, float]:
    """The placement's maximum utilisation and, with `noise`, its noise margin: the noise of
    the flows on its busiest link (independent: the root of the sum of squares) over the
    link's capacity. A gain in max utilisation below the two placements' margins summed may
    be the measurement's, not the placement's."""
    if noise is None or not len(inst.cap):
        return solver.max_util(inst, assign), 0.0
    load, var = solver.arc_sums(inst, assign, inst.demand, noise ** 2)
    util = (inst.base + load) / inst.cap
    a = int(np.argmax(util))
    return float(util[a]), math.sqrt(float(var[a])) / float(inst.cap[a])


def _arc_util(b: Built, assign: list[int]) -> dict[int, float]:
    if b.inst is None:
        return {}
    load = b.inst.base.copy()
    for f, k in enumerate(assign):
        if k >= 0:
            for a in b.inst.cand[f][k]:
                load[a] += b.inst.demand[f]
    return {int(a): float(load[a] / b.inst.cap[a]) for a in load.nonzero()[0]}


def _bare(addr: str) -> str:
    addr = addr.partition("/")[0]
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr


def _ident(s: str) -> str:
    """An assignment id fits the wire's 64-character identifier."""
    s = s.replace("[", "").replace("]", "")
    return s if len(s) <= 64 else "tcp:" + hashlib.sha1(s.encode()).hexdigest()[:32]


class Sinks:
    """Ingest's one frame sink fanned out to diagnosis and the planner, in that order (the
    planner reads diagnosis' incidents)."""

    def __init__(self, *sinks: Any) -> None:
        self.sinks = [s for s in sinks if s is not None]

    def observe(self, frame: Frame, now: float) -> None:
        for s in self.sinks:
            s.observe(frame, now)

    def tick(self, now: float) -> None:
        for s in self.sinks:
            s.tick(now)

    def host_silent(self, host: str, last_seen: float, now: float) -> None:
        for s in self.sinks:
            s.host_silent(host, last_seen, now)

    def host_back(self, host: str, now: float) -> None:
        for s in self.sinks:
            s.host_back(host, now)


def build_planner(table: dict[str, Any], db: sqlite3.Connection, topology: Topology | None,
                  diagnosis: Any, name: str = "aggregator") -> Planner | None:
    """The aggregator's planner from its `[planning]` table; None without a topology."""
    from c4.core import config as c4config

    cfg = c4config.build(PlanningConfig, table, "planning")
    if topology is None or not cfg.enabled:
        return None
    planner = Planner(topology, cfg, db, logging.getLogger("c4.aggregator.planner"), name,
                      (lambda: diagnosis.incidents("open")) if diagnosis is not None else None,
                      diagnosis.sent_to_hosts if diagnosis is not None else None)
    if diagnosis is not None:  # C4D votes with learned paths and asks for probes
        diagnosis.use_paths(planner)
    return planner
