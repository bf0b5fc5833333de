"""Name the component behind a set of bad connections (slow ones, or stuck ones in a hang).

Each connection ("cell") passes through components: its two hosts, their NICs, the links of
its learned path (access and fabric), and the host pair's path. A fault in component X makes
X's cells bad and leaves the others alone, so each candidate X is scored by how well "X is
faulty" explains the observation, cell by cell (007/NetBouncer-style voting made explicit):

    log P(obs | X) = n_bad(X) log(1-beta) + n_good(X) log(beta) + n_bad(not X) log(alpha) + ...

with alpha the chance a healthy cell looks persistently bad and beta the chance a cell of a
faulty component does not. Candidates covering exactly the same cells are aliases (a host with
one NIC, a NIC and its access cable) and are named by the most useful one. The posterior over
candidates plus "no fault" is the suspects' confidence: a whole row/column wins as its node, a
lone cell ties between its components (low confidence, not localised), several cells whose
paths share one fabric link elect that link. Faults are peeled off greedily, so two faults in
one job are both named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Hashable, Iterable, Mapping, TypeVar

from .findings import Suspect

ALPHA = 1e-3  # a healthy connection persistently slow (or stuck) anyway
BETA = 0.2  # a connection through the faulty component not flagged (marginal, no data)
_A = math.log((1 - BETA) / (1 - ALPHA))
_B = math.log(BETA / (1 - ALPHA))
_C = math.log(ALPHA / (1 - ALPHA))

# (kind, id, host, priority): lower priority names an alias group
Component = tuple[str, str, "str | None", int]
PRIO_HOST, PRIO_NIC, PRIO_FABRIC, PRIO_ACCESS, PRIO_PAIR = range(5)
_INTO = "=>"
K = TypeVar("K", bound=Hashable)  # a detector's cell key


def directed(link: str, to: str) -> str:
    """Component id of one direction of a cable (each is its own component: a fault is
    often in one): the link and the node it enters."""
    return f"{link}{_INTO}{to}"


def link_name(cid: str) -> tuple[str, str | None]:
    """(link id, the node a directed link component enters, or None)."""
    link, sep, to = cid.partition(_INTO)
    return link, (to or None) if sep else None


def public_key(key: str) -> str:
    """A component key ("kind:id") as incidents and people name it: a cable, not one of its
    directions."""
    kind, _, cid = key.partition(":")
    return f"{kind}:{link_name(cid)[0]}"


@dataclass
class Hypothesis:
    kind: str
    id: str
    host: str | None
    n_all: int
    n_bad: int
    ll: float
    posterior: float = 0.0
    aliases: list[str] = field(default_factory=list)
    bad: list[Hashable] = field(default_factory=list)
    rivals: list["Hypothesis"] = field(default_factory=list)  # explain some of the same cells
    split: int = 1  # unrelated components among its aliases: belief shared between them

    def ranked(self) -> list["Hypothesis"]:
        """This hypothesis then its rivals, best first: the suspects of one fault."""
        return [self] + self.rivals


@dataclass(slots=True)
class _Tally:
    """What a candidate touches: all its cells, its bad ones, and an order-free
    fingerprint (xor of cell hashes) that groups candidates covering the same cells."""
    n_all: int = 0
    n_bad: int = 0
    cells_xor: int = 0
    bad: list[Hashable] = field(default_factory=list)


def rank(bad: AbstractSet[Hashable], cells: Mapping[Hashable, list[Component]],
         exclude: frozenset[tuple[str, str]] = frozenset()) -> list[Hypothesis]:
    """Candidates that touch a bad cell, best first, with posteriors (aliases merged);
    `exclude`: (kind, id) of components already known faulty."""
    cand: dict[Component, _Tally] = {}
    for key in bad:
        for comp in cells.get(key, ()):
            if (comp[0], comp[1]) not in exclude:
                cand.setdefault(comp, _Tally())
    if not cand:
        return []
    for key, comps in cells.items():
        is_bad = key in bad
        kh = hash(key)
        for comp in comps:
            acc = cand.get(comp)
            if acc is not None:
                acc.n_all += 1
                acc.cells_xor ^= kh
                if is_bad:
                    acc.n_bad += 1
                    acc.bad.append(key)
    n_bad_total = len(bad)
    groups: dict[tuple[int, int, int], list[tuple[Component, _Tally]]] = {}
    for comp, acc in cand.items():
        groups.setdefault((acc.n_all, acc.n_bad, acc.cells_xor), []).append((comp, acc))
    hyps: list[Hypothesis] = []
    for (n_all, n_bad, _), members in groups.items():
        members.sort(key=lambda m: (m[0][3], m[0][1]))
        # Aliases that are parts of one another (a host, its NIC, the NIC's cable) name one
        # thing; unrelated ones (both ends of a lone connection, a NIC and a fabric link)
        # cannot be told apart: the belief is split between them, and the name is a link,
        # never a node that would be drained on a coin toss.
        roots = {_root(m[0]) for m in members}
        if len(roots) > 1:
            members.sort(key=lambda m: (m[0][0] != "link", _LINK_ORDER.get(m[0][3], 9), m[0][1]))
        (kind, cid, host, _prio), acc = members[0]
        ll = n_bad * _A + (n_all - n_bad) * _B + (n_bad_total - n_bad) * _C
        h = Hypothesis(kind, cid, host, n_all, n_bad, ll,
                       aliases=[f"{m[0][0]}:{m[0][1]}" for m in members[1:]],
                       bad=sorted(acc.bad, key=repr))
        h.split = len(roots)
        hyps.append(h)
    # A hypothesis competes with those explaining some of the same bad cells (and with "no
    # fault"); one explaining other cells is another fault, not an alternative.
    null_ll = n_bad_total * _C
    holding: dict[Hashable, list[Hypothesis]] = {}
    for h in hyps:
        for key in h.bad:
            holding.setdefault(key, []).append(h)
    order = lambda h: (-h.ll, h.kind, h.id)  # noqa: E731
    for h in hyps:
        rivals = list({id(r): r for key in h.bad for r in holding[key]}.values())
        top = max([r.ll for r in rivals] + [null_ll])
        z = math.exp(null_ll - top) + sum(math.exp(r.ll - top) for r in rivals)
        # one bad connection is thin evidence however clean the vote: it never reaches 0.8
        h.posterior = math.exp(h.ll - top) / z * (1.0 - BETA ** h.n_bad) / h.split
        h.rivals = sorted((r for r in rivals if r is not h), key=order)
    hyps.sort(key=order)
    return hyps


_LINK_ORDER = {PRIO_FABRIC: 0, PRIO_PAIR: 1, PRIO_ACCESS: 2}


def _root(comp: Component) -> str:
    """The physical unit a component belongs to: a host (with its NICs and their cables) or a
    fabric link or host-pair path of its own."""
    kind, cid, host, prio = comp
    if kind == "host":
        return f"host:{cid}"
    if kind == "nic":
        return f"host:{host}"
    if prio == PRIO_ACCESS:
        return f"host:{cid.partition('/')[0]}"
    return f"link:{link_name(cid)[0]}"


def peel(bad: set[Hashable], cells: Mapping[Hashable, list[Component]], confidence: float,
         values: Mapping[Hashable, float] | None = None, ratio: float = 1.6,
         max_faults: int = 8) -> tuple[list[list[Hypothesis]], list[Hypothesis]]:
    """Greedy multi-fault explanation: (rounds whose top is confident, the ranking left when
    no candidate is confident enough, empty if everything was explained).

    A named component's cells are explained and set aside, except those `ratio` times slower
    than its typical cell (`values`), when there are several: connections crossing two faulty
    components are slower than those crossing either, and stay evidence for the second."""
    bad = set(bad)
    cells = dict(cells)
    found: list[list[Hypothesis]] = []
    named: set[tuple[str, str]] = set()
    while bad and len(found) < max_faults:
        ranked = rank(bad, cells, frozenset(named))
        if not ranked or ranked[0].posterior < confidence:
            return found, ranked
        top = ranked[0]
        found.append(ranked)
        named.add((top.kind, top.id))
        named.update((kind, cid) for kind, _, cid in (a.partition(":") for a in top.aliases))
        keep: set[Hashable] = set()
        if values:
            vals = sorted(values[k] for k in top.bad)
            typical = vals[len(vals) // 2]
            keep = {k for k in top.bad if values[k] >= ratio * typical}
            if len(keep) < 2:
                keep = set()  # one extra-slow connection is a blip on top, not a second fault
        for key in top.bad:
            if key not in keep:
                bad.discard(key)
                cells.pop(key, None)
    return found, (rank(bad, cells, frozenset(named)) if bad else [])


def votes(bad: Iterable[K], paths: Mapping[K, list[str] | None]) -> dict[str, int]:
    """How many bad cells' paths cross each link (evidence for people)."""
    out: dict[str, int] = {}
    for key in bad:
        for link in paths.get(key) or ():
            out[link] = out.get(link, 0) + 1
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:6])


def name(top: Hypothesis, path: str | None = None,
         n: int = 4) -> tuple[list[Suspect], dict[str, Any], tuple[str, ...]]:
    """(suspects best first, evidence, alias keys) of one fault, named as people and
    incidents name components: a cable, with the direction(s) it failed in as evidence.

    When unrelated components explain exactly the same connections (`split`: a lone
    connection's NICs, cables and fabric links; the two cables to one spine when the job's
    connections cross it only between their two leaves, both ways), the evidence lists those
    candidate links (probes.py measures them), and the connections' `path`, when they share
    one, leads the suspects, at the confidence the evidence gives it."""
    sus: list[Suspect] = []
    seen: set[str] = set()
    for h in top.ranked():
        key = public_key(f"{h.kind}:{h.id}")
        if key not in seen and len(sus) < n:
            seen.add(key)
            sus.append(Suspect(h.kind, key.partition(":")[2], h.host, None, h.posterior))
    keys = [f"{top.kind}:{top.id}"] + top.aliases
    aliases = tuple(dict.fromkeys(k for k in map(public_key, top.aliases) if k not in seen))
    # links the evidence holds exactly as likely as the top's group (other connections, the
    # same bad cells: lab run Z, two leaf pairs' receivers counting loss, one pair through
    # each spine) are candidates too: probes measure them all
    tied = [h for h in top.rivals if h.kind == "link" and
            h.posterior * h.split >= top.posterior * top.split * (1 - 1e-9)]
    rival_keys = [k for h in tied for k in [f"{h.kind}:{h.id}", *h.aliases]]
    towards: dict[str, list[str]] = {}
    cables: list[str] = []
    for k in keys + rival_keys:
        kind, _, cid = k.partition(":")
        link, to = link_name(cid)
        if kind == "link" and link not in towards:
            towards[link] = []
            cables.append(link)
        if to:
            towards[link].append(to)
    ev: dict[str, Any] = {"aliases": list(aliases)}
    if top.kind == "link":
        ev["direction"] = _direction(top.id, towards[link_name(top.id)[0]])
    if (top.split > 1 or tied) and cables:
        ev["candidate_links"] = {lk: _direction(lk, towards[lk]) for lk in cables}
    if top.split > 1 and path is not None:
        sus.insert(0, Suspect("path", path, None, None, top.posterior))
        sus = sus[:n]
    return sus, ev, aliases


def _direction(cid: str, towards: list[str]) -> str:
    """Which way a named cable failed: one direction's component explains the connections
    best, or the whole cable does (both ways, or the only way the job crosses it)."""
    _, to = link_name(cid)
    if to:
        return f"towards {to}"
    if len(towards) == 1:
        return f"towards {towards[0]} (the only direction with traffic)"
    return "both"
