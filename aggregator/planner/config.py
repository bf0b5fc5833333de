"""C4P policy: the aggregator config's `[planning]` table (docs/planning.md)."""
from __future__ import annotations

from dataclasses import dataclass

from c4.core.config import ConfigError, field


@dataclass
class PlanningConfig:
    enabled: bool = field(True, "learn paths and propose plans (needs `topology`)")
    auto_apply: bool = field(
        False, "push plans to the agents without `c4 plan apply` (re-plans after link "
        "incidents, and periodic plans whose gain beats the demands' noise plus `min_gain`)")
    replan_on_incident: bool = field(
        True, "re-plan when a C4D incident names a fabric link or NIC, once localised (down: "
        "never used; slow or lossy: capacity scaled by `suspect_factor`), moving only what the "
        "change needs")
    interval_s: float = field(30.0, "seconds between periodic proposals")
    settle_s: float = field(
        30.0, "after a plan is applied, for this long only a link going down re-plans and "
        "no periodic plan is applied: the moved connections' reconnect stall raises slow "
        "incidents and skews measured rates; a slow/lossy change seen meanwhile re-plans "
        "when it ends, if it still holds")
    min_gain: float = field(
        0.05, "a periodic plan is applied automatically only when it lowers the busiest "
        "link's utilisation by at least this fraction of it, on top of what the noise in the "
        "measured demands could explain (`c4 plan --json`: `noise_margin`)")
    demand_window: int = field(
        5, "reports a flow's demand is taken over: the largest of its last this many "
        "measured rates (a connection's first one left out); a flow with fewer counts as "
        "noise only, so new flows alone never get a periodic plan applied")
    elastic: bool = field(
        True, "a flow that a full link (90 % or more) holds back, among the largest on it, is "
        "planned with the rate its NICs alone would allow it (its max-min fair share of the "
        "links all its paths share), not its measured rate: TCP and RoCE flows take what the "
        "link leaves them, so their rates show where they are, not what they want")
    suspect_factor: float = field(
        0.5, "capacity kept by a link an open slow/lossy incident names (0..1): load leaves it "
        "first")
    suspect_confidence: float = field(
        0.5, "a localised incident's top suspect counts as link health only at this confidence "
        "or more")
    probe_ports: int = field(
        16, "source ports traced per (source NIC, destination NIC, protocol): enough to find "
        "most equal-cost paths (16 ports find each of 8 paths with probability 0.88)")
    probe_retry_s: float = field(60.0, "an endpoint pair is probed again at most this often")
    probe_host_interval_s: float = field(
        2.0, "at most one probe request per host per this many seconds")
    probe_sports_per_s: float = field(
        2000.0, "at most this many traced source ports per second over all hosts")
    path_ttl_s: float = field(3600.0, "a learned path is trusted for this long")
    budget_s: float = field(0.5, "time the optimiser may spend on one plan (seconds)")
    replan_budget_s: float = field(
        0.08, "time the optimiser may spend on a re-plan after a link incident (seconds): it "
        "stops early when only the flows on the link moved, else it looks for fewer moves")
    tcp_ports: list[int] = field(
        [32768, 60999], "source-port range planned TCP connections may use (the hosts' "
        "ip_local_port_range); RoCE ports are always 49152-65535 (flow label at RTR)")

    def validate(self, where: str) -> None:
        where = f"{where}." if where else ""
        if not 0.0 < self.suspect_factor <= 1.0:
            raise ConfigError(f"{where}suspect_factor: must be in (0, 1]")
        if self.probe_ports < 1 or self.probe_ports > 64:
            raise ConfigError(f"{where}probe_ports: must be 1..64 (one probe entry's limit)")
        if len(self.tcp_ports) != 2 or not 1024 <= self.tcp_ports[0] < self.tcp_ports[1] <= 65535:
            raise ConfigError(f"{where}tcp_ports: expected [low, high] within 1024..65535")
        if min(self.interval_s, self.probe_retry_s, self.budget_s, self.replan_budget_s,
               self.path_ttl_s, self.probe_sports_per_s) <= 0:
            raise ConfigError(f"{where}interval_s, probe_retry_s, budget_s, replan_budget_s, "
                              "path_ttl_s, probe_sports_per_s: must be > 0")
        if self.probe_host_interval_s < 0 or self.settle_s < 0:
            raise ConfigError(f"{where}probe_host_interval_s, settle_s: must be >= 0")
        if not 1 <= self.demand_window <= 100:
            raise ConfigError(f"{where}demand_window: must be 1..100 reports")
        if not 0.0 <= self.min_gain < 1.0:
            raise ConfigError(f"{where}min_gain: must be in [0, 1)")
        if not 0.0 <= self.suspect_confidence <= 1.0:
            raise ConfigError(f"{where}suspect_confidence: must be in [0, 1]")
