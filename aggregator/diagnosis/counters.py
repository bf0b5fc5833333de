"""RoCE NIC counters (rdma section) that corroborate slow connections: congestion (ECN marks,
CNPs) and loss (out-of-sequence, sequence errors, ACK timeouts), judged against the other NICs
of the same job in the same interval."""
from __future__ import annotations

from typing import Any, Iterable

from c4.core.catalog import ROCE_RX as RX
from c4.core.catalog import ROCE_TX as TX
from c4.core.topology import endpoint

from .config import DiagnosisConfig
from .model import Cell, Comm
from .stats import median


NAMES = RX + TX


def port_rates(port: dict[str, Any], names: Iterable[str], interval: float) -> dict[str, float]:
    """Per-second rates of `names` in one rdma port entry: its `rates`, else its `deltas` over
    the interval. Look up the few RoCE names rather than filter every counter (a real port
    reports ~100): the cost per report stays that of the signals."""
    rates = port.get("rates")
    if rates is None:
        deltas = port.get("deltas") or {}
        return {k: deltas[k] / interval for k in names if k in deltas} if interval > 0 else {}
    return {k: float(rates[k]) for k in names if k in rates}


class Counters:
    def __init__(self, cfg: DiagnosisConfig) -> None:
        self.cfg = cfg
        self.rates: dict[str, dict[str, float]] = {}  # NIC endpoint -> counter -> per second

    def on_rdma(self, host: str, section: dict[str, Any], interval: float) -> None:
        for port in section.get("ports", []):
            self.rates[endpoint(host, port["dev"])] = port_rates(port, NAMES, interval)

    def forget_hosts(self, hosts: set[str]) -> None:
        for nic in [n for n in self.rates if n.partition("/")[0] in hosts]:
            del self.rates[nic]

    def corroborate(self, comm: Comm, cells: Iterable[Cell]) -> dict[str, dict[str, float]]:
        """Counters of the slow cells' ends that stand out against the job's NICs."""
        nics = {r.nic for r in comm.ranks.values() if r.nic in self.rates}
        if not nics:
            return {}
        base = {name: median([self.rates[n].get(name, 0.0) for n in nics]) for name in RX + TX}
        out: dict[str, dict[str, float]] = {}
        for c in cells:
            for rank, names in ((c.src, TX), (c.dst, RX)):
                rk = comm.ranks.get(rank)
                nic = rk.nic if rk else None
                rates = self.rates.get(nic) if nic else None
                if nic is None or not rates:
                    continue
                for name in names:
                    v = rates.get(name, 0.0)
                    if v >= max(self.cfg.counter_min_rate, self.cfg.counter_ratio * base[name]):
                        out.setdefault(nic, {})[name] = round(v, 1)
        return out
