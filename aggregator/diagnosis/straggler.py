"""Non-communication slow (straggler): the rank that arrives last at almost every collective.

Two views of one syndrome, each enough in a report; both are durations measured on each rank's
own host:
- its peers wait at the entry of each op (entry_wait_s per op is long), it does not: it finds
  everything ready. The shorter collective time of the straggler corroborates. This is how
  a straggler shows in a large job, where its peers are few and the median rank is not one;
- every other rank's collectives last until it arrives, its own do not: its collective time
  is the shortest, by far more than the others' spread. On a ring every rank waits, at entry
  or in a later step, for the one that arrives last (the lab's 8-rank ring: half the ranks
  are its peers, so their waits are the median), but only the straggler's ops are short."""
from __future__ import annotations

from typing import Any

from .config import DiagnosisConfig
from .findings import Finding, Suspect
from .model import Comm, Rank
from .stats import median

# Others' collective times vary by sigma (1.4826 x their median absolute deviation); the
# straggler's are shorter by at least this many sigma, besides straggler_op_share of their
# median. Not a test on its own (the shortest of 2,000 healthy ranks is 3.5 sigma short; the
# share and the same rank in almost every report are): it keeps a job whose collective times
# spread widely from naming one by the share alone. 5 sigma missed the lab's straggler for
# 14-52 s (its others spread by 0.1-0.3 s in some reports), 2 named it in 8-11 s.
OP_Z = 2.0


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
        shortest = self._shortest(ranks)  # (rank, the others' median op time) or None
        out = []
        for r in ranks:
            if not r.fresh:
                continue
            r_ew = ew[r.rank]
            peers = [ew[p] for p in r.peers if p in ew]
            flag = False
            late_op = None if m_op is None or r.op is None else m_op - r.op
            short = shortest[1] if shortest is not None and shortest[0] == r.rank else None
            if short is not None:
                flag = True
            elif peers:
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
            least = min(peers) if peers else None  # the peers' shortest wait, this report
            conf = 0.5 + 0.5 * hits / len(r.strag)
            if late_op is None:
                conf *= 0.85
            ev: dict[str, Any] = {
                "entry_wait_s_per_op": round(r_ew, 5),
                "peers_min_entry_wait_s_per_op": None if least is None else round(least, 5),
                "median_entry_wait_s_per_op": round(m_ew, 5),
                "op_time_s": round(r.op, 5) if r.op is not None else None,
                "median_op_time_s": round(m_op, 5) if m_op is not None else None,
                "reports_flagged": hits, "reports_judged": len(r.strag),
                "peers": sorted(r.peers)[:16],
            }
            if short is not None and r.op is not None:  # short is set only with r.op
                ev["others_median_op_time_s"] = round(short, 5)
                summary = (f"rank {r.rank} on {r.host} arrives last: its collectives take "
                           f"{r.op * 1e3:.0f} ms, the other ranks' {short * 1e3:.0f} ms (they "
                           f"wait for it) ({hits}/{len(r.strag)} reports)")
            else:  # flagged by its peers' waits now: it has peers
                assert least is not None
                summary = (f"rank {r.rank} on {r.host} arrives last: its {len(peers)} peer(s) "
                           f"wait {least * 1e3:.0f} ms at each collective, it waits "
                           f"{r_ew * 1e3:.0f} ms ({hits}/{len(r.strag)} reports)")
            out.append(Finding("noncomm_slow", comm.job, comm.comm,
                               [Suspect("rank", str(r.rank), r.host, r.rank, conf)], summary, ev,
                               now - hits * comm.interval))
        return out

    def _shortest(self, ranks: list[Rank]) -> tuple[int, float] | None:
        """(the rank, the other ranks' median collective time) when one rank's collectives
        are the shortest by a clear margin in this report (the collective view above), else
        None. Only the shortest can be: judged once per tick, not per rank (2,048 ranks)."""
        timed = sorted((r.op, r.rank) for r in ranks if r.op is not None)
        if len(timed) < 4 or timed[0][0] >= timed[1][0]:
            return None
        op, rank = timed[0]
        others = [x for x, _ in timed[1:]]
        m = median(others)
        sigma = 1.4826 * median([abs(x - m) for x in others])
        cfg = self.cfg
        if m - op >= max(cfg.straggler_min_wait_s, cfg.straggler_op_share * m, OP_Z * sigma):
            return rank, m
        return None
