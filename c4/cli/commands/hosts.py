"""`c4 hosts` and `c4 host NAME`: what the aggregator knows about each host."""
from __future__ import annotations

import argparse
from typing import Any
from urllib.parse import quote

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from c4.core.catalog import ROCE_SIGNALS

from ._http import add_aggregator_arg, query


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hosts", help="list hosts", description="List the hosts the aggregator "
                       "knows: status, last report, NICs, key RoCE rates, collector health.")
    add_aggregator_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_hosts)
    p = sub.add_parser("host", help="show one host", description="Show one host: inventory, "
                       "collector health, RDMA port counters with rates, recent events.")
    p.add_argument("name", help="host name as the agent reports it")
    p.add_argument("--counters", action="store_true",
                   help="also list every RDMA counter of every port with its delta and rate")
    add_aggregator_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_host)


def _hosts(args: argparse.Namespace) -> int:
    return query(args, "/api/v1/hosts", lambda d: hosts_table(d["hosts"]))


def _host(args: argparse.Namespace) -> int:
    return query(args, f"/api/v1/hosts/{quote(args.name, safe='')}",
                 lambda d: host_view(d, show_counters=args.counters))


def _rate(v: float | None) -> str:
    """Compact SI rendering for narrow terminals: 12000.0 -> 12.0k."""
    if v is None:
        return "-"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.1f}{unit}"
    return f"{v:.1f}"


def hosts_table(hosts: list[dict[str, Any]]) -> Table:
    t = Table(title=f"{len(hosts)} host(s)")
    for col in ("host", "status", "seen", "reports", "ports up", "CNP/s", "ECN/s", "OOS/s",
                "collectors"):
        t.add_column(col, no_wrap=col == "host",
                     justify="right" if col not in ("host", "status", "collectors") else "left")
    for h in hosts:
        r = h.get("rates", {})
        down = h.get("collectors_down", [])
        coll = f"{len(h.get('collectors_ok', []))} ok" + (f", off: {', '.join(down)}" if down else "")
        t.add_row(h["name"], "[red]silent[/]" if h["status"] == "silent" else "[green]up[/]",
                  f"{h['last_seen_age_s']:.1f}s", str(h["reports"]),
                  f"{h['ports_active']}/{h['ports']}", _rate(r.get("np_cnp_sent")),
                  _rate(r.get("np_ecn_marked_roce_packets")), _rate(r.get("out_of_sequence")), coll)
    return t


def host_view(h: dict[str, Any], show_counters: bool = False) -> Group:
    parts: list[Any] = []
    parts.append(f"[bold]{h['name']}[/]  status={h['status']}  agent={h.get('agent_version')}  "
                 f"last seen {h['last_seen_age_s']:.1f}s ago  reports={h['reports']}  "
                 f"seq={h['seq']['contiguous']} lost={h['seq']['lost']}")
    health = (h.get("report") or {}).get("health") or h.get("hello", {}).get("collectors", {})
    t = Table(title="collectors")
    t.add_column("collector")
    t.add_column("state")
    t.add_column("reason")
    for name in sorted(health):
        ok = health[name].get("ok")
        t.add_row(name, "[green]ok[/]" if ok else "[red]off[/]", escape(health[name].get("reason", "")))
    parts.append(t)
    report = h.get("report") or {}
    sender = report.get("sender")
    if sender:
        parts.append("agent delivery: " + "  ".join(f"{k}={v}" for k, v in sender.items()))
    ports = (report.get("rdma") or {}).get("ports", [])
    if ports:
        parts.append(ports_table(ports))
        if show_counters:
            parts.append(counters_table(ports))
    host = report.get("host")
    if host:
        parts.append(f"host: cpu {host['cpu_pct']:.1f}%  load1 {host['load1']:.2f}  mem "
                     f"{host['mem_used_bytes'] / 2**30:.1f}/{host['mem_total_bytes'] / 2**30:.1f} GiB"
                     f"  agent rss {host.get('agent_rss_bytes', 0) / 2**20:.0f} MiB")
    for table in (flows_table(report.get("tcp_flows")), qps_table(report.get("verbs_qp")),
                  comms_table(report.get("nccl"))):
        if table is not None:
            parts.append(table)
    events = h.get("events", [])
    if events:
        t = Table(title=f"recent events ({len(events)})")
        for col in ("agent time", "type", "severity", "device", "message"):
            t.add_column(col)
        for e in events[-20:]:
            t.add_row(f"{e['ts']:.3f}", e["type"], e["severity"], escape(e.get("device") or ""),
                      escape((e.get("msg") or "")[:80]))
        parts.append(t)
    return Group(*parts)

# Per port, the counters an operator looks at first: traffic, congestion, errors.
KEY_RATES = (("port_xmit_bytes", "tx B/s"), ("port_rcv_bytes", "rx B/s"),
             *((name, label) for name, (_, _, label) in ROCE_SIGNALS.items()))


def ports_table(ports: list[dict[str, Any]]) -> Table:
    t = Table(title="RDMA ports (rates per second over the last interval)")
    for col in ("port", "state", "netdev", "speed", *(label for _, label in KEY_RATES),
                "flaps"):
        t.add_column(col, no_wrap=col == "port")
    for p in ports:
        rates = p.get("rates", {})
        t.add_row(f"{p['dev']}/{p['port']}", p.get("state", ""), p.get("netdev") or "",
                  f"{p.get('rate_gbps', 0):g}G",
                  *(_rate(rates.get(k)) for k, _ in KEY_RATES),
                  str(p.get("counters", {}).get("link_downed", "-")))
    return t


def counters_table(ports: list[dict[str, Any]]) -> Table:
    t = Table(title="RDMA counters")
    for col in ("port", "counter", "value", "delta", "rate/s"):
        t.add_column(col, no_wrap=True)
    for p in ports:
        for name in sorted(p.get("counters", {})):
            rate = p.get("rates", {}).get(name)
            t.add_row(f"{p['dev']}/{p['port']}", name, f"{p['counters'][name]:,}",
                      str(p.get("deltas", {}).get(name, "")), "" if rate is None else _rate(rate))
    return t


ROWS_SHOWN = 10  # the human view lists the busiest few; --json has everything


def flows_table(sec: dict[str, Any] | None) -> Table | None:
    flows = (sec or {}).get("flows") or []
    if sec is None or not flows:
        return None
    flows = sorted(flows, key=lambda f: -f.get("bytes_acked_delta", 0))
    # The agent lists only flows that changed (plus a periodic full refresh): `tracked` counts
    # all of them.
    tracked = sec.get("tracked", len(flows))
    t = Table(title=f"TCP flows: {tracked} tracked, {len(flows)} listed this interval "
                    f"(busiest {min(len(flows), ROWS_SHOWN)})")
    for col in ("local", "remote", "pid/comm", "state", "tx B/s", "retrans", "srtt ms", "cwnd"):
        t.add_column(col, no_wrap=col in ("local", "remote"))
    for f in flows[:ROWS_SHOWN]:
        t.add_row(f"{f['saddr']}:{f['sport']}", f"{f['daddr']}:{f['dport']}",
                  escape(f"{f.get('pid', 0)}/{f.get('comm', '')}"), f.get("state", ""),
                  _rate(f.get("bytes_acked_rate")),
                  f"{f.get('retrans_segs', 0)} (+{f.get('retrans_segs_delta', 0)})",
                  f"{f.get('srtt_us', 0) / 1000:.2f}", str(f.get("cwnd", "")))
    return t


def qps_table(sec: dict[str, Any] | None) -> Table | None:
    qps = (sec or {}).get("qps") or []
    if not qps:
        return None
    t = Table(title=f"verbs QPs: {len(qps)}")
    for col in ("pid/comm", "lqpn", "rqpn", "type", "state", "port", "UDP sport"):
        t.add_column(col)
    for q in qps[:ROWS_SHOWN]:
        rqpn = q.get("rqpn")
        t.add_row(escape(f"{q.get('pid', 0)}/{q.get('comm', '')}"), f"{q['lqpn']:#x}",
                  "-" if rqpn is None else f"{rqpn:#x}", q.get("qp_type", ""),
                  q.get("state", "") + (" (destroyed)" if q.get("destroyed") else ""),
                  str(q.get("port") or "-"), str(q.get("sport") or "-"))
    return t


def comms_table(sec: dict[str, Any] | None) -> Table | None:
    comms = (sec or {}).get("comms") or []
    if not comms:
        return None
    t = Table(title=f"NCCL communicators: {len(comms)} rank(s) on this host")
    # completed is a count, the in-flight #n a 0-based ordinal (docs/wire.md): after 5
    # completed, the op in flight is #5
    for col in ("comm", "rank", "job", "pid", "completed", "in flight (ordinal)", "ops",
                "net wait s"):
        t.add_column(col)
    for c in comms[:ROWS_SHOWN * 2]:
        inflight = c.get("inflight")
        t.add_row(c["comm"], f"{c['rank']}/{c['nranks']}", escape(c.get("job") or "-"),
                  str(c.get("pid", "-")), str(c["seq_completed"]),
                  "-" if not inflight else f"{inflight['func']} #{inflight['seq']} "
                  f"{inflight['age_s']:.1f}s",
                  str(sum(x["count"] for x in c.get("colls", []))),
                  f"{sum(p['net_wait_s'] for p in c.get('peers', [])):.3f}")
    return t
