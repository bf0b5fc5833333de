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
"""
from __future__ import annotations

from typing import Iterable

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
