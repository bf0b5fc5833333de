"""tcp_flows collector: per-connection TCP counters aggregated in eBPF maps (bpf/tcp_flows.c).

The kernel program counts per socket; once per interval this module reads the maps, lists
the flows whose entry changed (every flow on a periodic refresh) with per-interval deltas
and rates, reports closed connections once and evicts them, and drains the ring buffer of
discrete events (retransmit bursts, resets). Kernel
features are detected from the tracefs format files of the running kernel and passed to the
compiler as -D flags, so an older kernel runs with fewer fields instead of failing.

The module is laid out in the order data flows: options, feature detection, raw map-entry
decoding, the per-interval flow table (pure, tested with captured entries), the collector.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import ipaddress
import os
import platform
import re
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from c4.core.wire.sections.tcp_flows import MAX_FLOWS_PER_REPORT, MAX_OWNERS, PROC_STATES

from .. import bpf, bpf_stats
from ..jobs import JobResolver, stat_fields
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
    refresh_intervals: int = 30

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
        refresh_intervals=get_int(NAME, options, "refresh_intervals", 30, 1, 86400),
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
        "sock/sock_send_length", "sock/sock_recv_length", "tcp/tcp_cong_state_set")}
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
        (has("tcp/tcp_probe", "snd_wnd"), "C4_HAVE_PROBE_SND_WND", "zero_window"),
        (has("tcp/tcp_retransmit_skb", "err"), "C4_HAVE_RETRANS_ERR", "retrans_err"),
        (has("tcp/tcp_cong_state_set", *SPLIT_TUPLE, "cong_state"), "C4_HAVE_CONG_STATE", "rto"),
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
FLOW_LAYOUT = struct.Struct("=5Q14I3H5B16s16s16sB4x")
EVENT_LAYOUT = struct.Struct("=Q3I3H2B16s16s16s4x")
CLOSED_KEY = struct.Struct("=2Q")
FIRST_NS = struct.Struct("=Q")  # struct flow starts with first_ns
AF_INET6 = 10
TCP_STATE_NAMES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1",
                   5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK",
                   10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV"}
# indexes of the `stats` per-CPU array (enum in bpf/tcp_flows.c)
STATS = ("map_full", "closed_full", "events_lost", "hit_probe", "hit_retrans", "hit_state",
         "hit_drop", "hit_reset", "hit_owner", "hit_cong")
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
    zero_wnd: int
    zwnd_epoch: int
    rto: int
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
    accepted: int

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

def _field_codes(fmt: str) -> list[str]:
    """One struct code per field of `fmt` (`5Q` is five fields, `16s` one; pads dropped)."""
    out: list[str] = []
    for count, code in re.findall(r"(\d*)([a-zA-Z?])", fmt):
        if code == "s":
            out.append(f"{count}s")
        elif code != "x":
            out += [code] * int(count or 1)
    return out


def _layout_keeping(names: tuple[str, ...]) -> struct.Struct:
    """struct flow with every field but `names` skipped as padding."""
    codes = _field_codes(FLOW_LAYOUT.format)
    return struct.Struct("=" + "".join(
        code if name in names else f"{struct.calcsize(code)}x"
        for name, code in zip(FlowEntry._fields, codes, strict=True))
        + f"{FLOW_LAYOUT.size - struct.calcsize('=' + ''.join(codes))}x")


# what a changed flow's row needs, in layout order: unpacked for every changed flow every
# interval, it skips the 16-byte strings and the fields only the kernel uses
HOT_FIELDS = ("first_ns", "cookie", "bytes_acked", "bytes_received", "retrans", "retrans_fail",
              "drops", "last_drop_reason", "state_changes", "srtt_us", "cwnd", "pid",
              "zero_wnd", "rto", "state", "owner_known", "ignored", "closed")
HOT_LAYOUT = _layout_keeping(HOT_FIELDS)

# bytes_acked, bytes_received, retrans, drops, zero_wnd, rto
Counts = tuple[int, int, int, int, int, int]
ZERO: Counts = (0, 0, 0, 0, 0, 0)
LISTED, UNATTRIBUTED, IGNORED = 0, 1, 2  # what a flow is to the report
COUNTER_KEYS = ("state", "bytes_acked", "bytes_received", "retrans_segs", "bytes_acked_delta",
                "bytes_received_delta", "retrans_segs_delta", "bytes_acked_rate",
                "bytes_received_rate", "srtt_us", "cwnd", "closed", "state_changes")


class Seen:
    """A live flow as of the previous read, updated in place: one per flow per interval."""

    __slots__ = ("raw", "first_ns", "kind", "counts", "pid", "cookie", "template")

    def __init__(self, first_ns: int) -> None:
        self.raw = b""  # struct flow as last read; b"": list it at the next read
        self.first_ns = first_ns
        self.kind = LISTED
        self.counts = ZERO  # at the last read: deltas are against it
        # the flow's rows are copies of `template`, made for this pid and cookie (each is
        # set once): a dict copy and a dozen stores cost less than a 22-key dict display
        self.pid = self.cookie = -1
        self.template: dict[str, Any] = {}


@dataclass
class TableResult:
    flows: list[dict[str, Any]]
    omitted: int
    tracked: int
    unattributed: int
    unchanged: int


Listed = tuple[int, int, Seen, dict[str, Any]]  # bytes moved, retransmits, flow, row


def _activity(item: Listed) -> tuple[int, int]:
    return item[0], item[1]


@dataclass
class FlowTable:
    """Turns map snapshots into report rows: the flows whose kernel entry changed since the
    previous read (every flow on a refresh), with deltas; closed flows once, then forgotten.
    Runs over every flow every interval: an unchanged flow costs a dict lookup and a bytes
    comparison; a changed one a partial unpack and a copy of its row template, whose
    addresses and owner were formatted once (bench/agent_cpu.py)."""

    max_report: int
    owner_filter: bool
    netns_of: Callable[[int], int]  # pid -> network namespace inode (0: unknown)
    drop_names: Mapping[int, str] = field(default_factory=dict)
    job_of: Callable[[int], str | None] = lambda pid: None  # pid -> job id (agent/jobs.py)
    _seen: dict[int, Seen] = field(default_factory=dict)  # socket address -> live flow

    def update(self, live: Mapping[int, bytes], closed: Iterable[tuple[bytes, bytes]],
               interval: float, refresh: bool = False) -> TableResult:
        """`live`: socket address -> struct flow, from the flows map; `closed`: (struct
        closed_key, struct flow) taken from the closed map; `interval`: seconds since the
        previous update; `refresh`: list unchanged flows too."""
        seen, nxt = self._seen, {}
        per_s = 1.0 / interval if interval > 0 else 0.0
        listed: list[Listed] = []
        kinds = [0, 0, 0]
        # a flow that closed between the two reads is in both: closed wins
        gone = {CLOSED_KEY.unpack(k): v for k, v in closed}
        unchanged = 0
        for sk, raw in live.items():
            st = seen.get(sk)
            if st is None or st.raw != raw or refresh:
                if gone and (sk, FIRST_NS.unpack_from(raw)[0]) in gone:
                    continue
                st = self._take(sk, raw, st, per_s, listed)
            elif gone and (sk, st.first_ns) in gone:
                continue
            else:
                unchanged += st.kind == LISTED
            kinds[st.kind] += 1
            nxt[sk] = st
        for (sk, _), raw in gone.items():
            kinds[self._take(sk, raw, seen.get(sk), per_s, listed).kind] += 1
        if len(listed) > self.max_report:  # keep the most active: bytes, then retransmits
            listed.sort(key=_activity, reverse=True)
            for _, _, st, _ in listed[self.max_report:]:
                st.raw = b""  # not listed: list it next time, even if it stays idle
        self._seen = nxt  # forgets closed flows and flows that vanished (e.g. a missed close)
        rows = [row for _, _, _, row in listed[:self.max_report]]
        return TableResult(rows, len(listed) - len(rows), kinds[LISTED] + kinds[UNATTRIBUTED],
                           kinds[UNATTRIBUTED], unchanged)

    def owners(self) -> dict[int, str]:
        """pid -> job of the processes owning tracked flows that carry a job, listed this
        interval or not (a hung job's flows are all unchanged)."""
        return {st.pid: st.template["job"] for st in self._seen.values()
                if st.kind == LISTED and "job" in st.template}

    def _take(self, sk: int, raw: bytes, st: Seen | None, per_s: float,
              listed: list[Listed]) -> Seen:
        """The flow's state after entry `raw`; its row goes to `listed` unless it is hidden."""
        (first_ns, cookie, acked, received, retrans, retrans_fail, drops, last_drop,
         state_changes, srtt_us, cwnd, pid, zero_wnd, rto, state, owner_known, ignored,
         closed) = HOT_LAYOUT.unpack(raw)
        if st is None or st.first_ns != first_ns:  # new, or its socket address was reused
            st = Seen(first_ns)
        st.raw = raw
        if ignored:
            st.kind = IGNORED
            return st
        if self.owner_filter and not owner_known:
            st.kind = UNATTRIBUTED  # counts stay zero: its first listing carries all of it
            return st
        st.kind = LISTED
        if st.pid != pid or st.cookie != cookie:
            st.pid, st.cookie, st.template = pid, cookie, self._template(FlowEntry.decode(raw))
        p = st.counts
        st.counts = (acked, received, retrans, drops, zero_wnd, rto)
        acked_d, received_d, retrans_d = acked - p[0], received - p[1], retrans - p[2]
        row = st.template.copy()
        row["state"] = TCP_STATE_NAMES.get(state, "UNKNOWN")
        row["bytes_acked"] = acked
        row["bytes_received"] = received
        row["retrans_segs"] = retrans
        row["bytes_acked_delta"] = acked_d
        row["bytes_received_delta"] = received_d
        row["retrans_segs_delta"] = retrans_d
        row["bytes_acked_rate"] = acked_d * per_s
        row["bytes_received_rate"] = received_d * per_s
        row["srtt_us"] = srtt_us
        row["cwnd"] = cwnd
        row["closed"] = closed == 1
        row["state_changes"] = state_changes
        if retrans_fail:
            row["retrans_failed"] = retrans_fail
        if drops:
            row["drops"] = drops
            row["drops_delta"] = drops - p[3]
            row["last_drop_reason"] = self.drop_names.get(last_drop, f"REASON_{last_drop}")
        if zero_wnd:
            row["zero_window"] = zero_wnd
            row["zero_window_delta"] = zero_wnd - p[4]
        if rto:
            row["rto"] = rto
            row["rto_delta"] = rto - p[5]
        listed.append((acked_d + received_d, retrans_d, st, row))
        return st

    def _template(self, e: FlowEntry) -> dict[str, Any]:
        # the owner's netns is read once, while the owner most likely still runs
        row: dict[str, Any] = {
            "saddr": _addr(e.saddr, e.family), "daddr": _addr(e.daddr, e.family),
            "sport": e.sport, "dport": e.dport, "family": _family(e.family),
            "netns": self.netns_of(e.pid) if e.pid else 0, "pid": e.pid, "comm": e.comm}
        if e.cookie:
            row["cookie"] = e.cookie
        if e.accepted:
            row["accepted"] = True
        job = self.job_of(e.pid) if e.pid else None  # read once per owner, like netns
        if job:
            row["job"] = job
        row.update(dict.fromkeys(COUNTER_KEYS))  # slots the rows fill in
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
    missed: int = 0                      # program runs the kernel skipped (bpf_stats)


class Reporter:
    """Snapshot -> report section and events: the collector minus the kernel."""

    def __init__(self, opts: Options, feats: Features, netns_of: Callable[[int], int],
                 job_of: Callable[[int], str | None] = lambda pid: None,
                 proc_of: Callable[[int], dict[str, Any]] | None = None) -> None:
        self.opts, self.feats = opts, feats
        self.proc_of = proc_of or proc_reader(Path("/proc"))
        self.table = FlowTable(opts.max_report_flows, opts.owner_filter, netns_of,
                               feats.drop_reasons, job_of=job_of)
        self._drops: dict[str, int] = {}
        self._reports = 0

    def report(self, snap: Snapshot, interval: float) -> Sample:
        # the first report lists every flow, and so does every refresh_intervals-th after it
        refresh = self._reports % self.opts.refresh_intervals == 0
        self._reports += 1
        res = self.table.update(snap.live, snap.closed, interval, refresh)
        drops = drop_counts(snap.drop_slots, self.feats.drop_reasons)
        section: dict[str, Any] = {
            "flows": res.flows, "omitted": res.omitted, "tracked": res.tracked,
            "unchanged": res.unchanged, "refresh": refresh,
            "map_full": snap.stats.get(STATS.index("map_full"), 0),
            "drops": drops,
            "drops_delta": {k: v - self._drops.get(k, 0) for k, v in drops.items()
                            if v != self._drops.get(k, 0)},
            "closed_lost": snap.stats.get(STATS.index("closed_full"), 0),
            "events_lost": snap.stats.get(STATS.index("events_lost"), 0) + snap.perf_lost,
            "runs_missed": snap.missed,
            "features": list(self.feats.names),
        }
        self._drops = drops
        if self.opts.owner_filter:
            section["unattributed"] = res.unattributed
        owners = self.table.owners()
        if owners:  # two /proc reads (stat, io) per job process per interval
            section["owners"] = [{"pid": pid, **self.proc_of(pid), "job": owners[pid]}
                                 for pid in sorted(owners)[:MAX_OWNERS]]
        events = [e for e in (decode_event(raw, self.feats.rst_reasons) for raw in snap.events)
                  if e]
        if len(events) > self.opts.max_events:
            section["events_suppressed"] = len(events) - self.opts.max_events
            events = events[:self.opts.max_events]
        return Sample(section, events)


# ---------------------------------------------------------------------------------- collector

def _netns_reader(proc_root: Path) -> Callable[[int], int]:
    root = str(proc_root)

    def netns_of(pid: int) -> int:
        try:
            return os.stat(f"{root}/{pid}/ns/net").st_ino  # (pathlib costs more than stat)
        except OSError:
            return 0  # the process is gone (or another pid namespace)
    return netns_of


def proc_reader(proc_root: Path) -> Callable[[int], dict[str, Any]]:
    """pid -> its owner fields: `state`, the letter in `<proc_root>/<pid>/stat` (`X`: gone
    or unreadable), `cpu_s` (utime + stime, same read) and `written` (`wchar` of
    `<pid>/io`), each absent when unreadable: C4D must not take "unknown" for "idle"."""
    tick = os.sysconf("SC_CLK_TCK")

    def proc_of(pid: int) -> dict[str, Any]:
        fields = stat_fields(proc_root, pid)
        state = fields[0].decode("ascii", "replace") if fields else "X"
        out: dict[str, Any] = {"state": state if state in PROC_STATES else "X"}
        if fields and len(fields) > 12:  # fields 14, 15: utime, stime in clock ticks
            try:
                out["cpu_s"] = (int(fields[11]) + int(fields[12])) / tick
            except ValueError:
                pass
        try:  # EACCES without ptrace rights over it, ENOENT once gone
            io = (proc_root / str(pid) / "io").read_bytes()
        except OSError:
            return out
        for line in io.splitlines():
            name, _, value = line.partition(b":")
            if name == b"wchar" and value.strip().isdigit():
                out["written"] = int(value)
        return out
    return proc_of


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
        keys, values = self.read_packed(delete)
        return list(zip(_split(keys, self.ksize), _split(values, self.vsize)))

    def read_packed(self, delete: bool = False) -> tuple[bytes, bytes]:
        """Every key, then every value, each packed in one bytes object, in the same order
        (an `array` reads fixed-size ones at once)."""
        if self.batch:
            try:
                n = self._read_batch(delete)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP, ENOTSUPP):
                    raise
                self.batch = False
            else:  # copy out the entries read, not the whole buffer
                return (ctypes.string_at(self.keys, self.ksize * n),
                        ctypes.string_at(self.values, self.vsize * n))
        items = [(bytes(k), bytes(v)) for k, v in self.table.items()]
        if delete:
            for k, _ in items:
                self.table.pop(self.table.Key.from_buffer_copy(k), None)
        return b"".join(k for k, _ in items), b"".join(v for _, v in items)

    def _read_batch(self, delete: bool) -> int:
        """Entries read into self.keys / self.values."""
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
        return total


def _split(packed: bytes, size: int) -> list[bytes]:
    return [packed[i:i + size] for i in range(0, len(packed), size)]


def percpu_sums(reader: MapReader) -> dict[int, int]:
    """Per-CPU array index -> sum over CPUs (each value holds one u64 per possible CPU)."""
    keys, values = reader.read_packed()
    per_cpu, ncpu = array("Q", values), reader.vsize // 8
    return dict(zip(array("I", keys),
                    (sum(per_cpu[i:i + ncpu]) for i in range(0, len(per_cpu), ncpu))))


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
        self._reporter = Reporter(self.opts, feats, _netns_reader(self.ctx.proc_root),
                                  JobResolver(self.ctx.proc_root).job_of,
                                  proc_reader(self.ctx.proc_root))
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
        self._config.epoch = self._config.epoch % 0xFFFFFFFF + 1  # 0 means "not configured"
        b[b"config"][ctypes.c_int(0)] = self._config
        maps = self._maps
        keys, values = maps["flows"].read_packed()  # u64 socket address -> struct flow
        snap = Snapshot(
            live=dict(zip(array("Q", keys), _split(values, FLOW_LAYOUT.size))),
            closed=maps["closed"].read(delete=True),
            stats=percpu_sums(maps["stats"]),
            drop_slots=percpu_sums(maps["drops_by_reason"]),
            events=self._events, perf_lost=self._lost_perf, missed=self._missed())
        self._events = []
        return snap

    def _missed(self) -> int:
        total = 0
        for fn in self._bpf.funcs.values():
            try:
                total += bpf_stats.prog_info(fn.fd).missed
            except OSError:  # the syscall refused: counted as none, the counts stay bounds
                pass
        return total

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
