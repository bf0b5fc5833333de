"""Non-communication slow (straggler): the rank that arrives last at almost every collective.

Its peers wait at the entry of each op (entry_wait_s per op is long), it does not: it finds
everything ready. Both are durations measured on each rank's own host. The shorter collective
time of the straggler (others' op time includes waiting for it) corroborates."""
from __future__ import annotations

from typing import Any

from .config import DiagnosisConfig
from .findings import Finding, Suspect
from .model import Comm
from .stats import median


class StragglerDetector:
    def __init__(self, cfg: DiagnosisConfig) -> None:
        self.cfg = cfg

    def tick(self, comm: Comm, now: float) -> list[Finding]:
        cfg = self.cfg
        stale = cfg.stale_intervals * comm.interval
        ranks = [r for r in comm.ranks.values() if r.ew is not None and now - r.seen <= stale]
        if len(ranks) < 4:
            return []
        ew: dict[int, float] = {r.rank: r.ew for r in ranks if r.ew is not None}
        m_ew = median(list(ew.values()))
        ops = [r.op for r in ranks if r.op is not None]
        m_op = median(ops) if ops else None
        out = []
        for r in ranks:
            if not r.fresh:
                continue
            r_ew = ew[r.rank]
            peers = [ew[p] for p in r.peers if p in ew]
            flag = False
            late_op = None if m_op is None or r.op is None else m_op - r.op
            if peers:
                pmin = min(peers)
                flag = (pmin >= cfg.straggler_min_wait_s
                        and pmin >= cfg.straggler_ratio * max(m_ew, r_ew, 1e-9)
                        # Others' collectives last until the straggler arrives; its own do
                        # not. Judged per report like the waits: a rank sharing the
                        # straggler's peers shows their waits in every report, and now and
                        # then a short collective (a partial interval)
                        and (late_op is None or late_op >= 0.5 * (pmin - r_ew)))
            r.strag.append(flag)
            while len(r.strag) > cfg.straggler_window:
                r.strag.popleft()
            hits = sum(r.strag)
            if hits < cfg.straggler_persist or not flag:
                continue
            pmin = min(peers)
            conf = 0.5 + 0.5 * hits / len(r.strag)
            if late_op is None:
                conf *= 0.85
            ev: dict[str, Any] = {
                "entry_wait_s_per_op": round(r_ew, 5),
                "peers_min_entry_wait_s_per_op": round(pmin, 5),
                "median_entry_wait_s_per_op": round(m_ew, 5),
                "op_time_s": round(r.op, 5) if r.op is not None else None,
                "median_op_time_s": round(m_op, 5) if m_op is not None else None,
                "reports_flagged": hits, "reports_judged": len(r.strag),
                "peers": sorted(r.peers)[:16],
            }
            summary = (f"rank {r.rank} on {r.host} arrives last: its {len(peers)} peer(s) wait "
                       f"{pmin * 1e3:.0f} ms at each collective, it waits "
                       f"{r_ew * 1e3:.0f} ms ({hits}/{len(r.strag)} reports)")
            out.append(Finding("noncomm_slow", comm.job, comm.comm,
                               [Suspect("rank", str(r.rank), r.host, r.rank, conf)], summary, ev,
                               now - hits * comm.interval))
        return out
