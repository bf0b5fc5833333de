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
import errno
import functools
import heapq
import ipaddress
import os
import platform
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from c4.wire.sections.tcp_flows import MAX_FLOWS_PER_REPORT

from .. import bpf
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
        max_report_flows=get_int(NAME, options, "max_report_flows", 2048, 1,
                                 MAX_FLOWS_PER_REPORT),
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
        drop_reasons=kfree.symbols("reason") if kfree and "drop_reason" in names else {},
        rst_reasons=reset.symbols("reason") if reset and "-DC4_HAVE_RST_REASON" in flags else {},
        ringbuf=ringbuf)


# ------------------------------------------------------------------------ map-entry decoding

# Layouts of struct flow / struct event in bpf/tcp_flows.c (sizes checked against BCC's).
FLOW_LAYOUT = struct.Struct("=5Q11I3H5B16s16s16sx")
EVENT_LAYOUT = struct.Struct("=Q3I3H2B16s16s16s4x")
CLOSED_KEY = struct.Struct("=2Q")
FLOW_KEY = struct.Struct("=Q")
U32 = struct.Struct("=I")
AF_INET6 = 10
TCP_STATE_NAMES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
                   5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK",
                   10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
# indexes of the `stats` per-CPU array (enum in bpf/tcp_flows.c)
STATS = ("map_full", "closed_full", "events_lost", "hit_probe", "hit_retrans", "hit_state",
         "hit_drop", "hit_reset", "hit_owner")
DROP_SLOTS = 256
EV_RETRANS_BURST, EV_RESET_SENT, EV_RESET_RECEIVED = 1, 2, 3


@functools.lru_cache(maxsize=8192)  # a host talks to few addresses; formatting is slow
def _addr(raw: bytes, family: int) -> str:
    return str(ipaddress.IPv6Address(raw) if family == AF_INET6
               else ipaddress.IPv4Address(raw[:4]))


@functools.lru_cache(maxsize=4096)
def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def _family(family: int) -> str:
    return "ipv6" if family == AF_INET6 else "ipv4"


class FlowEntry(NamedTuple):
    """One `struct flow`, fields in layout order (flags are 0/1)."""

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
    snd_una: int
    srtt_us: int
    cwnd: int
    pid: int
    burst_epoch: int
    burst_count: int
    sport: int
    dport: int
    family: int
    state: int
    una_valid: int
    owner_known: int
    ignored: int
    closed: int
    saddr: bytes
    daddr: bytes
    comm_raw: bytes

    @classmethod
    def decode(cls, raw: bytes) -> FlowEntry:
        return cls._make(FLOW_LAYOUT.unpack(raw))

    @property
    def comm(self) -> str:
        return _comm(self.comm_raw)


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
Counts = tuple[int, int, int, int]  # bytes_acked, bytes_received, retrans, drops


@dataclass
class TableResult:
    flows: list[dict[str, Any]]
    omitted: int
    tracked: int
    unattributed: int


@dataclass
class FlowTable:
    """Turns map snapshots into report rows: deltas against the previous interval, top flows
    by activity, closed flows reported once and then forgotten. Runs over every flow every
    interval, so it keeps to tuples and caches (bench/agent_cpu.py)."""

    max_report: int
    owner_filter: bool
    netns_of: Callable[[int], int]  # pid -> network namespace inode (0: unknown)
    drop_names: Mapping[int, str] = field(default_factory=dict)
    _prev: dict[FlowId, Counts] = field(default_factory=dict)
    _netns: dict[FlowId, int] = field(default_factory=dict)

    def update(self, live: Mapping[int, FlowEntry], closed: Iterable[tuple[FlowId, FlowEntry]],
               interval: float) -> TableResult:
        """`live`: socket address -> entry of the flows map; `closed`: entries taken from
        the closed map; `interval`: seconds since the previous update."""
        entries: dict[FlowId, FlowEntry] = {(sk, e.first_ns): e for sk, e in live.items()
                                            if not e.ignored}
        entries.update(closed)  # a flow that closed between the two reads: closed wins
        unattributed = 0
        scored = []
        prev, zero = self._prev, (0, 0, 0, 0)
        current: dict[FlowId, Counts] = {}
        for fid, e in entries.items():
            if self.owner_filter and not e.owner_known:
                unattributed += 1
                continue
            counts = (e.bytes_acked, e.bytes_received, e.retrans, e.drops)
            # a flow absent last time was created since: all of it is this interval's
            p = prev.get(fid, zero)
            deltas = (counts[0] - p[0], counts[1] - p[1], counts[2] - p[2], counts[3] - p[3])
            scored.append((deltas[0] + deltas[1], deltas[2], fid, e, deltas))
            if not e.closed:
                current[fid] = counts
        top = heapq.nlargest(self.max_report, scored)  # ties end at the unique fid
        per_s = 1.0 / interval if interval > 0 else 0.0
        rows = [self._row(fid, e, deltas, per_s) for _, _, fid, e, deltas in top]
        # forget closed flows and flows that vanished (e.g. a missed close)
        self._prev = current
        for fid in [f for f in self._netns if f not in current]:
            del self._netns[fid]
        return TableResult(rows, len(scored) - len(rows), len(entries), unattributed)

    def _row(self, fid: FlowId, e: FlowEntry, deltas: Counts, per_s: float) -> dict[str, Any]:
        # one unpack instead of ~25 attribute loads: this runs for every flow every interval
        (_, cookie, _, acked, received, retrans, retrans_fail, drops, last_drop, state_changes,
         _, srtt_us, cwnd, pid, _, _, sport, dport, family, state, _, _, _, closed, saddr,
         daddr, comm_raw) = e
        netns = self._netns.get(fid)
        if netns is None and pid:  # read once, while the owner most likely still runs
            netns = self._netns[fid] = self.netns_of(pid)
        acked_d, received_d = deltas[0], deltas[1]
        row: dict[str, Any] = {
            "saddr": _addr(saddr, family), "daddr": _addr(daddr, family),
            "sport": sport, "dport": dport, "family": _family(family),
            "netns": netns or 0, "pid": pid, "comm": _comm(comm_raw),
            "state": TCP_STATE_NAMES.get(state, "UNKNOWN"),
            "bytes_acked": acked, "bytes_received": received, "retrans_segs": retrans,
            "bytes_acked_delta": acked_d, "bytes_received_delta": received_d,
            "retrans_segs_delta": deltas[2],
            "bytes_acked_rate": acked_d * per_s, "bytes_received_rate": received_d * per_s,
            "srtt_us": srtt_us, "cwnd": cwnd, "closed": closed == 1,
            "state_changes": state_changes,
        }
        if retrans_fail:
            row["retrans_failed"] = retrans_fail
        if drops:
            row["drops"] = drops
            row["drops_delta"] = deltas[3]
            row["last_drop_reason"] = self.drop_names.get(last_drop, f"REASON_{last_drop}")
        if cookie:
            row["cookie"] = cookie
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


@dataclass
class Snapshot:
    """What one collect reads from the kernel, raw (the unit tests replay captured ones)."""

    live: dict[int, bytes]               # socket address -> struct flow
    closed: list[tuple[bytes, bytes]]    # struct closed_key, struct flow
    stats: dict[int, int]                # STATS index -> sum over CPUs
    drop_slots: dict[int, int]           # drop reason slot -> sum over CPUs
    events: list[bytes]                  # struct event records
    perf_lost: int = 0                   # perf buffer losses reported to user space


class Reporter:
    """Snapshot -> report section and events: the collector minus the kernel."""

    def __init__(self, opts: Options, feats: Features, netns_of: Callable[[int], int]) -> None:
        self.opts, self.feats = opts, feats
        self.table = FlowTable(opts.max_report_flows, opts.owner_filter, netns_of,
                               feats.drop_reasons)
        self._drops: dict[str, int] = {}

    def report(self, snap: Snapshot, interval: float) -> Sample:
        live = {sk: FlowEntry.decode(raw) for sk, raw in snap.live.items()}
        closed = [(CLOSED_KEY.unpack(key), FlowEntry.decode(raw)) for key, raw in snap.closed]
        res = self.table.update(live, closed, interval)
        drops = drop_counts(snap.drop_slots, self.feats.drop_reasons)
        section: dict[str, Any] = {
            "flows": res.flows, "omitted": res.omitted, "tracked": res.tracked,
            "map_full": snap.stats.get(STATS.index("map_full"), 0),
            "drops": drops,
            "drops_delta": {k: v - self._drops.get(k, 0) for k, v in drops.items()
                            if v != self._drops.get(k, 0)},
            "closed_lost": snap.stats.get(STATS.index("closed_full"), 0),
            "events_lost": snap.stats.get(STATS.index("events_lost"), 0) + snap.perf_lost,
            "features": list(self.feats.names),
        }
        self._drops = drops
        if self.opts.owner_filter:
            section["unattributed"] = res.unattributed
        events = [e for e in (decode_event(raw, self.feats.rst_reasons) for raw in snap.events)
                  if e]
        if len(events) > self.opts.max_events:
            section["events_suppressed"] = len(events) - self.opts.max_events
            events = events[:self.opts.max_events]
        return Sample(section, events)


# ---------------------------------------------------------------------------------- collector

def _netns_reader(proc_root: Path) -> Callable[[int], int]:
    def netns_of(pid: int) -> int:
        try:
            return os.stat(proc_root / str(pid) / "ns" / "net").st_ino
        except OSError:
            return 0  # the process is gone (or another pid namespace)
    return netns_of


ENOTSUPP = 524  # the kernel's internal "not supported", not in Python's errno


class MapReader:
    """Whole-map reads as raw (key, value) bytes, in batch syscalls into buffers kept for
    the next interval. BCC's own batch API makes a ctypes object per entry, which costs
    more than everything else the collector does with a flow."""

    def __init__(self, table: Any) -> None:
        from bcc.libbcc import lib  # BCC is there: the program loaded

        self.lib, self.table = lib, table
        self.ksize, self.vsize = ctypes.sizeof(table.Key), ctypes.sizeof(table.Leaf)
        self.cap = table.max_entries
        self.keys = ctypes.create_string_buffer(self.ksize * self.cap)
        self.values = ctypes.create_string_buffer(self.vsize * self.cap)
        self.batch = True  # until the kernel says otherwise (batch ops: Linux 5.6+)

    def read(self, delete: bool = False) -> list[tuple[bytes, bytes]]:
        if self.batch:
            try:
                return self._read_batch(delete)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    raise
                self.batch = False
        items = [(bytes(k), bytes(v)) for k, v in self.table.items()]
        if delete:
            for k, _ in items:
                self.table.pop(self.table.Key.from_buffer_copy(k), None)
        return items

    def _read_batch(self, delete: bool) -> list[tuple[bytes, bytes]]:
        fn = self.lib.bpf_lookup_and_delete_batch if delete else self.lib.bpf_lookup_batch
        token, total = ctypes.c_uint32(0), 0
        while total < self.cap:
            count = ctypes.c_uint32(self.cap - total)
            res = fn(self.table.map_fd, ctypes.byref(token) if total else None,
                     ctypes.byref(token), ctypes.byref(self.keys, self.ksize * total),
                     ctypes.byref(self.values, self.vsize * total), ctypes.byref(count))
            err = ctypes.get_errno()
            total += count.value
            if res != 0:
                if err == errno.ENOENT:
                    break  # the whole map was read
                raise OSError(err, f"bpf map batch read: {os.strerror(err)}")
            if count.value == 0:
                break  # no progress: concurrent updates; the rest comes next interval
        keys = self.keys.raw[:self.ksize * total]
        values = self.values.raw[:self.vsize * total]
        return [(keys[i * self.ksize:(i + 1) * self.ksize],
                 values[i * self.vsize:(i + 1) * self.vsize]) for i in range(total)]


def percpu_sums(reader: MapReader) -> dict[int, int]:
    """Per-CPU array index -> sum over CPUs (each value holds one u64 per possible CPU)."""
    per_cpu = struct.Struct(f"={reader.vsize // 8}Q")
    return {U32.unpack(k)[0]: sum(per_cpu.unpack(v)) for k, v in reader.read()}


class TcpFlowsCollector(Collector):
    name = NAME

    def __init__(self, ctx: Context, options: Mapping[str, Any],
                 tracefs: Path = bpf.TRACEFS) -> None:
        super().__init__(ctx, options)
        self.opts = parse_options(options)
        self.tracefs = tracefs
        self._bpf: Any = None
        self._maps: dict[str, MapReader] = {}
        self._reporter: Reporter | None = None
        self._ringbuf = True
        self._config: Any = None
        self._events: list[bytes] = []
        self._lost_perf = 0
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
        cflags = feats.cflags + (("-DC4_CGROUP_FILTER",) if self.opts.cgroup else ())
        b = bpf.load("tcp_flows.c", tracepoints=REQUIRED_TRACEPOINTS, cflags=cflags)
        try:
            for table in (b"flows", b"closed"):
                if ctypes.sizeof(b[table].Leaf) != FLOW_LAYOUT.size:
                    raise CollectorUnavailable(
                        f"bpf/tcp_flows.c struct flow is {ctypes.sizeof(b[table].Leaf)} bytes, "
                        f"the decoder expects {FLOW_LAYOUT.size}: they must change together")
            self._fill_filters(b, cg)
            if feats.ringbuf:
                b[b"events"].open_ring_buffer(self._on_event)
            else:
                b[b"events"].open_perf_buffer(self._on_perf_event, page_cnt=8,
                                             lost_cb=self._on_perf_lost)
            self._maps = {name: MapReader(b[name.encode()])
                          for name in ("flows", "closed", "stats", "drops_by_reason")}
        except BaseException:
            b.cleanup()  # detach the programs: nothing half-started keeps running
            raise
        self._bpf, self._ringbuf = b, feats.ringbuf
        self._reporter = Reporter(self.opts, feats, _netns_reader(self.ctx.proc_root))
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
        if self._bpf is None or self._reporter is None:
            raise RuntimeError("tcp_flows: collect() before start()")
        interval = max(now - (self._last or now), 0.0)
        self._last = now
        return self._reporter.report(self.snapshot(), interval)

    def snapshot(self) -> Snapshot:
        """Read the maps and drain the event buffer (also used to capture test fixtures)."""
        b = self._bpf
        if self._ringbuf:
            b.ring_buffer_consume()
        else:
            b.perf_buffer_poll(timeout=0)
        # a retransmit burst counts within one interval: start the next one
        self._config.epoch = (self._config.epoch + 1) & 0xFFFFFFFF
        b[b"config"][ctypes.c_int(0)] = self._config
        maps = self._maps
        snap = Snapshot(
            live={FLOW_KEY.unpack(k)[0]: v for k, v in maps["flows"].read()},
            closed=maps["closed"].read(delete=True),
            stats=percpu_sums(maps["stats"]),
            drop_slots=percpu_sums(maps["drops_by_reason"]),
            events=self._events, perf_lost=self._lost_perf)
        self._events = []
        return snap

    def stats(self) -> dict[str, int]:
        """The program's own counters (tracepoint hits, map full), for bench/."""
        if self._bpf is None:
            return {}
        sums = percpu_sums(self._maps["stats"])
        return {name: sums.get(i, 0) for i, name in enumerate(STATS)}

    def programs(self) -> dict[str, int]:
        """Loaded program name -> fd, for bench/ (fdinfo shows run_time_ns and run_cnt while
        kernel.bpf_stats_enabled=1)."""
        if self._bpf is None:
            return {}
        return {name.decode(): fn.fd for name, fn in self._bpf.funcs.items()}

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
