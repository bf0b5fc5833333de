"""tcp_flows collector: per-connection TCP counters aggregated in eBPF maps (bpf/tcp_flows.c).

The kernel program counts per socket; once per interval this module reads the maps, turns
counters into per-interval deltas and rates, reports closed connections once and evicts
them, and drains the ring buffer of discrete events (retransmit bursts, resets). Kernel
features are detected from the tracefs format files of the running kernel and passed to the
compiler as -D flags, so an older kernel runs with fewer fields instead of failing.

The module is laid out in the order data flows: options, feature detection, raw map-entry
decoding, the per-interval flow table (pure, tested with captured entries), the collector.
"""
from __future__ import annotations

import ctypes
import heapq
import ipaddress
import os
import platform
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .. import bpf
from ..deltas import CounterTracker
from .base import Collector, CollectorUnavailable, Context, Event, OptionError, Sample
from .options import check_keys, get_int

NAME = "tcp_flows"

# ---------------------------------------------------------------------------------- options

MAX_PIDS = 1024  # C4_MAX_PIDS in bpf/tcp_flows.c


@dataclass(frozen=True)
class Options:
    ports: tuple[int, ...] = ()
    pids: tuple[int, ...] = ()
    cgroup: str = ""
    max_flows: int = 16384
    max_report_flows: int = 2048
    retrans_burst: int = 100
    max_events: int = 100

    @property
    def owner_filter(self) -> bool:
        return bool(self.pids or self.cgroup)


def _int_list(options: Mapping[str, Any], key: str, lo: int, hi: int,
              max_len: int) -> tuple[int, ...]:
    value = options.get(key, [])
    if (not isinstance(value, list) or len(value) > max_len
            or not all(isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
                       for v in value)):
        raise OptionError(f"collectors.{NAME}.{key}: expected a list of at most {max_len} "
                          f"integers in [{lo}, {hi}], got {value!r}")
    return tuple(sorted(set(value)))


def parse_options(options: Mapping[str, Any]) -> Options:
    check_keys(NAME, options, Options.__dataclass_fields__)
    cgroup = options.get("cgroup", "")
    if not isinstance(cgroup, str) or (cgroup and not cgroup.startswith("/")):
        raise OptionError(f"collectors.{NAME}.cgroup: expected an absolute cgroup v2 "
                          f"directory path (or \"\" for none), got {cgroup!r}")
    return Options(
        ports=_int_list(options, "ports", 1, 65535, 65535),
        pids=_int_list(options, "pids", 1, 2**31 - 1, MAX_PIDS),
        cgroup=cgroup.rstrip("/") or ("/" if cgroup else ""),
        max_flows=get_int(NAME, options, "max_flows", 16384, 64, 1 << 20),
        max_report_flows=get_int(NAME, options, "max_report_flows", 2048, 1, 65536),
        retrans_burst=get_int(NAME, options, "retrans_burst", 100, 0, 1 << 30),
        max_events=get_int(NAME, options, "max_events", 100, 0, 100000),
    )


def cgroup_target(path: str, mountinfo: str) -> tuple[int, int]:
    """(id, level) of a cgroup v2 directory: the id is its inode number; the level counts
    the components below the cgroup2 mount (the hierarchy root is level 0)."""
    best = None
    for line in mountinfo.splitlines():
        pre, _, post = line.partition(" - ")
        parts, fstype = pre.split(), post.split()[:1]
        if fstype != ["cgroup2"] or len(parts) < 5:
            continue
        mnt = parts[4]
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and (
                best is None or len(mnt) > len(best)):
            best = mnt
    if best is None:
        raise CollectorUnavailable(f"collectors.{NAME}.cgroup: {path} is not on a cgroup v2 "
                                   "mount (the eBPF cgroup id is the v2 hierarchy's)")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise CollectorUnavailable(f"collectors.{NAME}.cgroup: {path}: {exc.strerror}") from None
    rel = Path(path).relative_to(best).parts
    return st.st_ino, len(rel)


# -------------------------------------------------------------------------- kernel features

REQUIRED_TRACEPOINTS = ("tcp/tcp_probe", "tcp/tcp_retransmit_skb", "sock/inet_sock_set_state",
                        "skb/kfree_skb")
REQUIRED_FIELDS = {
    "tcp/tcp_probe": ("skaddr", "saddr", "daddr", "sport", "dport", "family", "data_len",
                      "snd_una", "snd_cwnd", "srtt"),
    "tcp/tcp_retransmit_skb": ("skaddr", "state", "sport", "dport", "family", "saddr", "daddr",
                               "saddr_v6", "daddr_v6"),
    "sock/inet_sock_set_state": ("skaddr", "oldstate", "newstate", "sport", "dport", "family",
                                 "protocol", "saddr", "daddr", "saddr_v6", "daddr_v6"),
    "skb/kfree_skb": ("protocol",),
}
SPLIT_TUPLE = ("skaddr", "sport", "dport", "family", "saddr", "daddr", "saddr_v6", "daddr_v6")
_FIELD = re.compile(r"field:(?P<type>[^;]*?)\s*(?P<name>\w+)(\[\w*\])?;\s*offset:\d+;"
                    r"\s*size:(?P<size>\d+);")
_SYMBOL = re.compile(r"\{\s*(-?(?:0x[0-9a-fA-F]+|\d+))\s*,\s*\"([^\"]*)\"\s*\}")


@dataclass(frozen=True)
class TracepointFormat:
    fields: dict[str, tuple[str, int]]  # name -> (C type, size)
    print_fmt: str

    def symbols(self, field_name: str) -> dict[int, str]:
        """Numeric names of `field_name` from `__print_symbolic(REC->field, ...)`."""
        start = self.print_fmt.find(f"__print_symbolic(REC->{field_name},")
        if start < 0:
            return {}
        depth, end = 0, len(self.print_fmt)
        for i in range(start, len(self.print_fmt)):
            ch = self.print_fmt[i]
            depth += ch == "("
            depth -= ch == ")"
            if ch == ")" and depth == 0:
                end = i
                break
        return {int(n, 0): name for n, name in _SYMBOL.findall(self.print_fmt[start:end])}


def read_format(tracefs: Path, tp: str) -> TracepointFormat | None:
    try:
        text = (tracefs / "events" / tp / "format").read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CollectorUnavailable(f"cannot read {tracefs}/events/{tp}/format: "
                                   f"{exc.strerror}") from None
    fields = {m["name"]: (m["type"].strip(), int(m["size"])) for m in _FIELD.finditer(text)
              if not m["name"].startswith("common_")}
    _, _, fmt = text.partition("print fmt:")
    return TracepointFormat(fields, fmt.strip())


@dataclass(frozen=True)
class Features:
    cflags: tuple[str, ...]
    names: tuple[str, ...]          # reported in the section's `features`
    drop_reasons: dict[int, str]    # enum skb_drop_reason of this kernel
    rst_reasons: dict[int, str]     # enum sk_rst_reason of this kernel
    ringbuf: bool


def detect_features(tracefs: Path, kernel_release: str, max_flows: int) -> Features:
    """Map the running kernel's tracepoint formats to -D flags for bpf/tcp_flows.c."""
    fmts = {tp: read_format(tracefs, tp) for tp in (
        *REQUIRED_TRACEPOINTS, "tcp/tcp_send_reset", "tcp/tcp_receive_reset",
        "sock/sock_send_length", "sock/sock_recv_length")}
    for tp, need in REQUIRED_FIELDS.items():
        fmt = fmts[tp]
        if fmt is None:
            raise CollectorUnavailable(f"kernel {kernel_release} lacks tracepoint {tp}")
        missing = [f for f in need if f not in fmt.fields]
        if missing:
            raise CollectorUnavailable(f"tracepoint {tp} on kernel {kernel_release} lacks "
                                       f"field(s) {', '.join(missing)}")
    major_minor = tuple(int(x) for x in re.findall(r"\d+", kernel_release)[:2])
    ringbuf = major_minor >= (5, 8)
    flags = [f"-DC4_MAX_FLOWS={max_flows}", "-DC4_RING_PAGES=32"]
    names = ["ringbuf"] if ringbuf else ["perf_buffer"]
    if ringbuf:
        flags.append("-DC4_RINGBUF")

    def has(tp: str, *fields: str) -> bool:
        fmt = fmts[tp]
        return fmt is not None and all(f in fmt.fields for f in fields)

    optional = [
        (has("tcp/tcp_probe", "sock_cookie"), "C4_HAVE_PROBE_COOKIE", "cookie"),
        (has("tcp/tcp_retransmit_skb", "err"), "C4_HAVE_RETRANS_ERR", "retrans_err"),
        (has("skb/kfree_skb", "reason"), "C4_HAVE_KFREE_REASON", "drop_reason"),
        (has("skb/kfree_skb", "rx_sk"), "C4_HAVE_RX_SK", "rx_sk"),
        # only the sockaddr layout (6.x); older kernels split v4/v6 fields here
        (has("tcp/tcp_send_reset", "skaddr", "state", "saddr", "daddr")
         and fmts["tcp/tcp_send_reset"].fields["saddr"][1] >= 28,  # type: ignore[union-attr]
         "C4_HAVE_SEND_RESET", "send_reset"),
        (has("tcp/tcp_receive_reset", *SPLIT_TUPLE), "C4_HAVE_RECEIVE_RESET", "receive_reset"),
        (has("sock/sock_send_length", "sk", "protocol")
         and has("sock/sock_recv_length", "sk", "protocol", "ret", "flags"),
         "C4_HAVE_SOCK_LENGTH", "sock_length"),
    ]
    for ok, flag, name in optional:
        if ok:
            flags.append(f"-D{flag}")
            names.append(name)
    if "send_reset" in names and has("tcp/tcp_send_reset", "reason"):
        flags.append("-DC4_HAVE_RST_REASON")
    if "receive_reset" in names and has("tcp/tcp_receive_reset", "sock_cookie"):
        flags.append("-DC4_HAVE_RECEIVE_RESET_COOKIE")
    kfree, reset = fmts["skb/kfree_skb"], fmts["tcp/tcp_send_reset"]
    return Features(
        cflags=tuple(flags), names=tuple(names),
        drop_reasons=kfree.symbols("reason") if kfree else {},
        rst_reasons=reset.symbols("reason") if reset and "-DC4_HAVE_RST_REASON" in flags else {},
        ringbuf=ringbuf)


# ------------------------------------------------------------------------ map-entry decoding

# Layouts of struct flow / struct event in bpf/tcp_flows.c (sizes checked against BCC's).
FLOW_LAYOUT = struct.Struct("=5Q11I3H5B16s16s16sx")
EVENT_LAYOUT = struct.Struct("=Q3I3H2B16s16s16s4x")
CLOSED_KEY = struct.Struct("=2Q")
AF_INET6 = 10
TCP_STATE_NAMES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
                   5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK",
                   10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
# indexes of the `stats` per-CPU array (enum in bpf/tcp_flows.c)
STATS = ("map_full", "closed_full", "events_lost", "hit_probe", "hit_retrans", "hit_state",
         "hit_drop", "hit_reset", "hit_owner")
DROP_SLOTS = 256
EV_RETRANS_BURST, EV_RESET_SENT, EV_RESET_RECEIVED = 1, 2, 3


def _addr(raw: bytes, family: int) -> str:
    return str(ipaddress.IPv6Address(raw) if family == AF_INET6
               else ipaddress.IPv4Address(raw[:4]))


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _family(family: int) -> str:
    return "ipv6" if family == AF_INET6 else "ipv4"


@dataclass(slots=True)
class FlowEntry:
    """One decoded `struct flow`."""

    first_ns: int
    cookie: int
    cgroup: int
    bytes_acked: int
    bytes_received: int
    retrans: int
    retrans_fail: int
    drops: int
    last_drop_reason: int
    state_changes: int
    srtt_us: int
    cwnd: int
    pid: int
    sport: int
    dport: int
    family: int
    state: int
    owner_known: bool
    ignored: bool
    closed: bool
    saddr: bytes
    daddr: bytes
    comm: str

    @classmethod
    def decode(cls, raw: bytes) -> FlowEntry:
        (first_ns, cookie, cgroup, acked, received, retrans, retrans_fail, drops, last_drop,
         state_changes, _snd_una, srtt, cwnd, pid, _bepoch, _bcount, sport, dport, family,
         state, _una_valid, owner_known, ignored, closed, saddr, daddr,
         comm) = FLOW_LAYOUT.unpack(raw)
        return cls(first_ns, cookie, cgroup, acked, received, retrans, retrans_fail, drops,
                   last_drop, state_changes, srtt, cwnd, pid, sport, dport, family, state,
                   bool(owner_known), bool(ignored), bool(closed), saddr, daddr, _comm(comm))


def decode_event(raw: bytes, rst_reasons: Mapping[int, str]) -> Event | None:
    """A ring-buffer record as a wire Event; None for an unknown type."""
    (_cookie, pid, count, reason, sport, dport, family, etype, state, saddr, daddr,
     comm) = EVENT_LAYOUT.unpack_from(raw)
    attrs: dict[str, Any] = {
        "saddr": _addr(saddr, family), "daddr": _addr(daddr, family), "sport": sport,
        "dport": dport, "family": _family(family), "pid": pid, "comm": _comm(comm),
        "state": TCP_STATE_NAMES.get(state, "UNKNOWN")}
    where = f"{attrs['saddr']}:{sport} -> {attrs['daddr']}:{dport}"
    if etype == EV_RETRANS_BURST:
        attrs["retrans"] = count
        return Event("tcp_retrans_burst", "warning", attrs,
                     f"{count} retransmits within one interval on {where}")
    if etype in (EV_RESET_SENT, EV_RESET_RECEIVED):
        attrs["direction"] = "sent" if etype == EV_RESET_SENT else "received"
        if reason in rst_reasons:
            attrs["reason"] = rst_reasons[reason]
        return Event("tcp_reset", "warning", attrs, f"reset {attrs['direction']} on {where}"
                     + (f" ({attrs['reason']})" if "reason" in attrs else ""))
    return None


# ------------------------------------------------------------------------- per-interval table

FlowId = tuple[int, int]  # (socket address, first_ns): unique over time
COUNTED = ("bytes_acked", "bytes_received", "retrans", "drops")


@dataclass
class TableResult:
    flows: list[dict[str, Any]]
    omitted: int
    tracked: int
    unattributed: int


@dataclass
class FlowTable:
    """Turns map snapshots into report rows: deltas against the previous interval, top flows
    by activity, closed flows reported once and then forgotten."""

    max_report: int
    owner_filter: bool
    netns_of: Callable[[int], int]  # pid -> network namespace inode (0: unknown)
    drop_names: Mapping[int, str] = field(default_factory=dict)
    _counters: CounterTracker = field(default_factory=CounterTracker)
    _netns: dict[FlowId, int] = field(default_factory=dict)

    def update(self, live: Mapping[int, FlowEntry], closed: Iterable[tuple[FlowId, FlowEntry]],
               now: float, interval: float) -> TableResult:
        """`live`: socket address -> entry of the flows map; `closed`: entries taken from
        the closed map; `interval`: seconds since the previous update."""
        entries: dict[FlowId, FlowEntry] = {(sk, e.first_ns): e for sk, e in live.items()
                                            if not e.ignored}
        entries.update(closed)  # a flow that closed between the two reads: closed wins
        tracked = len(entries)
        unattributed = 0
        scored = []
        for fid, e in entries.items():
            if self.owner_filter and not e.owner_known:
                unattributed += 1
                continue
            values = {k: getattr(e, k) for k in COUNTED}
            change = self._counters.update(fid, now, values)
            deltas = values if change is None else change.deltas
            activity = (deltas["bytes_acked"] + deltas["bytes_received"], deltas["retrans"])
            scored.append((activity, fid, e, deltas))
        top = heapq.nlargest(self.max_report, scored, key=lambda s: s[0])
        rows = [self._row(fid, e, deltas, interval) for _, fid, e, deltas in top]
        # forget closed flows and flows that vanished (e.g. a missed close)
        keep = {fid for fid, e in entries.items() if not e.closed}
        for fid in self._counters.retain(keep):
            self._netns.pop(fid, None)
        return TableResult(rows, len(scored) - len(rows), tracked, unattributed)

    def _row(self, fid: FlowId, e: FlowEntry, deltas: Mapping[str, int],
             interval: float) -> dict[str, Any]:
        if fid not in self._netns:
            self._netns[fid] = self.netns_of(e.pid) if e.pid else 0
        per_s = 1.0 / interval if interval > 0 else 0.0
        row: dict[str, Any] = {
            "saddr": _addr(e.saddr, e.family), "daddr": _addr(e.daddr, e.family),
            "sport": e.sport, "dport": e.dport, "family": _family(e.family),
            "netns": self._netns[fid], "pid": e.pid, "comm": e.comm,
            "state": TCP_STATE_NAMES.get(e.state, "UNKNOWN"),
            "bytes_acked": e.bytes_acked, "bytes_received": e.bytes_received,
            "retrans_segs": e.retrans,
            "bytes_acked_delta": deltas["bytes_acked"],
            "bytes_received_delta": deltas["bytes_received"],
            "retrans_segs_delta": deltas["retrans"],
            "bytes_acked_rate": deltas["bytes_acked"] * per_s,
            "bytes_received_rate": deltas["bytes_received"] * per_s,
            "srtt_us": e.srtt_us, "cwnd": e.cwnd, "closed": e.closed,
            "state_changes": e.state_changes,
        }
        if e.retrans_fail:
            row["retrans_failed"] = e.retrans_fail
        if e.drops:
            row["drops"] = e.drops
            row["drops_delta"] = deltas["drops"]
            row["last_drop_reason"] = self.drop_names.get(e.last_drop_reason,
                                                          f"REASON_{e.last_drop_reason}")
        if e.cookie:
            row["cookie"] = e.cookie
        return row


def drop_counts(slots: Mapping[int, int], names: Mapping[int, str]) -> dict[str, int]:
    """Per-reason totals by kernel name; the last slot holds reasons >= DROP_SLOTS - 1."""
    out: dict[str, int] = {}
    for slot, n in slots.items():
        if not n:
            continue
        name = "OTHER" if slot == DROP_SLOTS - 1 else names.get(slot, f"REASON_{slot}")
        out[name] = out.get(name, 0) + n
    return out


# ---------------------------------------------------------------------------------- collector

def _netns_reader(proc_root: Path) -> Callable[[int], int]:
    def netns_of(pid: int) -> int:
        try:
            return os.stat(proc_root / str(pid) / "ns" / "net").st_ino
        except OSError:
            return 0  # the process is gone (or another pid namespace)
    return netns_of


def _read_table(table: Any, delete: bool = False) -> list[tuple[Any, Any]]:
    """All entries in one batch syscall where the kernel supports it."""
    try:
        if delete:
            return list(table.items_lookup_and_delete_batch())
        return list(table.items_lookup_batch())
    except Exception:  # BCC raises bare Exception: no batch ops (kernel < 5.6) or EINVAL
        items = list(table.items())
        if delete:
            for k, _ in items:
                try:
                    del table[k]
                except KeyError:
                    pass
        return items


def _int_key(k: Any) -> int:
    return k if isinstance(k, int) else k.value  # batch reads give ints, items() ctypes


def _percpu_sums(table: Any) -> dict[int, int]:
    return {_int_key(k): sum(v) for k, v in _read_table(table)}


class TcpFlowsCollector(Collector):
    name = NAME

    def __init__(self, ctx: Context, options: Mapping[str, Any],
                 tracefs: Path = bpf.TRACEFS) -> None:
        super().__init__(ctx, options)
        self.opts = parse_options(options)
        self.tracefs = tracefs
        self._bpf: Any = None
        self._features: Features | None = None
        self._table: FlowTable | None = None
        self._config: Any = None
        self._events: list[bytes] = []
        self._lost_perf = 0
        self._drops: dict[str, int] = {}
        self._last: float | None = None

    def start(self) -> None:
        bpf.import_bcc()
        bpf.check_privilege()
        bpf.check_tracepoints(REQUIRED_TRACEPOINTS)
        feats = detect_features(self.tracefs, platform.release(), self.opts.max_flows)
        cg = (0, 0)
        if self.opts.cgroup:
            mountinfo = (self.ctx.proc_root / "self" / "mountinfo").read_text()
            cg = cgroup_target(self.opts.cgroup, mountinfo)
        b = bpf.load("tcp_flows.c", tracepoints=REQUIRED_TRACEPOINTS, cflags=feats.cflags)
        for table, layout in ((b"flows", FLOW_LAYOUT), (b"closed", FLOW_LAYOUT)):
            if ctypes.sizeof(b[table].Leaf) != layout.size:
                b.cleanup()
                raise CollectorUnavailable(f"bpf/tcp_flows.c struct flow is "
                                           f"{ctypes.sizeof(b[table].Leaf)} bytes, the decoder "
                                           f"expects {layout.size}: they must change together")
        self._fill_filters(b, cg)
        if feats.ringbuf:
            b[b"events"].open_ring_buffer(self._on_event)
        else:
            b[b"events"].open_perf_buffer(self._on_perf_event, page_cnt=8,
                                         lost_cb=self._on_perf_lost)
        self._bpf, self._features = b, feats
        self._table = FlowTable(self.opts.max_report_flows, self.opts.owner_filter,
                                _netns_reader(self.ctx.proc_root), feats.drop_reasons)
        self._last = self.ctx.clock()
        self.ctx.log.info("tcp_flows: tracing with %s", ", ".join(feats.names))

    def _fill_filters(self, b: Any, cg: tuple[int, int]) -> None:
        one = ctypes.c_uint8(1)
        for port in self.opts.ports:
            b[b"port_filter"][ctypes.c_int(port)] = one
        for pid in self.opts.pids:
            b[b"pid_filter"][ctypes.c_uint32(pid)] = one
        conf = b[b"config"].Leaf()
        conf.flags = ((1 if self.opts.ports else 0) | (2 if self.opts.pids else 0)
                      | (4 if self.opts.cgroup else 0))
        conf.epoch = 1
        conf.burst = self.opts.retrans_burst
        conf.cg_id, conf.cg_level = cg
        b[b"config"][ctypes.c_int(0)] = conf
        self._config = conf

    def _on_event(self, _ctx: Any, data: Any, size: int) -> None:
        self._events.append(ctypes.string_at(data, size))

    def _on_perf_event(self, _cpu: int, data: Any, size: int) -> None:
        self._events.append(ctypes.string_at(data, size))

    def _on_perf_lost(self, lost: int) -> None:
        self._lost_perf += lost

    def collect(self, now: float) -> Sample:
        b, feats, table = self._bpf, self._features, self._table
        if b is None or feats is None or table is None:
            raise RuntimeError("tcp_flows: collect() before start()")
        interval = max(now - (self._last or now), 0.0)
        self._last = now
        if feats.ringbuf:
            b.ring_buffer_consume()
        else:
            b.perf_buffer_poll(timeout=0)
        # a retransmit burst counts within one interval: start the next one
        self._config.epoch = (self._config.epoch + 1) & 0xFFFFFFFF
        b[b"config"][ctypes.c_int(0)] = self._config

        live = {_int_key(k): FlowEntry.decode(bytes(v)) for k, v in _read_table(b[b"flows"])}
        closed = []
        for k, v in _read_table(b[b"closed"], delete=True):
            sk, first_ns = CLOSED_KEY.unpack(bytes(k))
            closed.append(((sk, first_ns), FlowEntry.decode(bytes(v))))
        res = table.update(live, closed, now, interval)

        stats = _percpu_sums(b[b"stats"])
        drops = drop_counts(_percpu_sums(b[b"drops_by_reason"]), feats.drop_reasons)
        section: dict[str, Any] = {
            "flows": res.flows, "omitted": res.omitted, "tracked": res.tracked,
            "map_full": stats.get(STATS.index("map_full"), 0),
            "drops": drops,
            "drops_delta": {k: v - self._drops.get(k, 0) for k, v in drops.items()
                            if v != self._drops.get(k, 0)},
            "closed_lost": stats.get(STATS.index("closed_full"), 0),
            "events_lost": stats.get(STATS.index("events_lost"), 0) + self._lost_perf,
            "features": list(feats.names),
        }
        self._drops = drops
        if self.opts.owner_filter:
            section["unattributed"] = res.unattributed
        events = [e for e in (decode_event(raw, feats.rst_reasons) for raw in self._events) if e]
        self._events.clear()
        if len(events) > self.opts.max_events:
            section["events_suppressed"] = len(events) - self.opts.max_events
            events = events[:self.opts.max_events]
        return Sample(section, events)

    def stats(self) -> dict[str, int]:
        """The program's own counters (tracepoint hits, map full), for bench/."""
        if self._bpf is None:
            return {}
        sums = _percpu_sums(self._bpf[b"stats"])
        return {name: sums.get(i, 0) for i, name in enumerate(STATS)}

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
