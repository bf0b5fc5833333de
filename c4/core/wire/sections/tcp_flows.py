"""`tcp_flows` section: per-connection TCP counters from eBPF tracepoints (bpf/tcp_flows.c),
plus host-wide skb drop reasons, and the discrete events retransmit burst and reset."""
from __future__ import annotations

from ..schema import COUNTER, U32, Bool, Enum, Float, Int, List, Map, Record, Str

# ~330 bytes per flow in msgpack: 3,000 flows stay well inside a 1 MiB frame
MAX_FLOWS_PER_REPORT = 3000
TCP_STATES = ("ESTABLISHED", "SYN_SENT", "SYN_RECV", "FIN_WAIT1", "FIN_WAIT2", "TIME_WAIT",
              "CLOSE", "CLOSE_WAIT", "LAST_ACK", "LISTEN", "CLOSING", "NEW_SYN_RECV", "UNKNOWN")
FAMILY = Enum(("ipv4", "ipv6"))
ADDR = Str(45, r"[0-9a-fA-F:.]+")
PORT = Int(0, 65535)
COMM = Str(16)
REASON = Str(64, r"[A-Z0-9_]+")
RATE = Float(0, 1e15)
MAX_OWNERS = 1024  # distinct job processes owning tracked flows on one host
# /proc/PID/stat state letters (R running, S sleeping, D uninterruptible, T stopped, t traced,
# Z zombie, X gone, I idle kernel thread, P parked); `X` also when /proc/PID is gone
PROC_STATES = ("R", "S", "D", "T", "t", "Z", "X", "I", "P", "W", "K")

OWNER = Record(
    required={"pid": U32, "state": Enum(PROC_STATES), "job": Str(128)},
    optional={"cpu_s": Float(0, 1e12), "written": COUNTER},
    doc={
        "pid": "process (thread group) owning some of the host's tracked flows",
        "state": "its state letter from `/proc/PID/stat` when the report was made: `R` "
                 "running, `S` sleeping, `D` uninterruptible sleep, `T` stopped (SIGSTOP), `t` "
                 "stopped by a tracer, `Z` zombie, `X` gone (no /proc entry)",
        "job": "its job id, as on its flows",
        "cpu_s": "CPU time it has used, all its threads (utime + stime of `/proc/PID/stat`, "
                 "seconds), from the same read as `state`: C4D tells a hung rank that neither "
                 "runs nor writes from a checkpoint writer; absent when unreadable",
        "written": "bytes it has written through write syscalls (`wchar` of `/proc/PID/io`: "
                   "any file system, pipes); absent when unreadable (another user's process "
                   "without CAP_SYS_PTRACE, or gone), never 0 for unknown",
    },
)

FLOW = Record(
    required={
        "saddr": ADDR,
        "daddr": ADDR,
        "sport": PORT,
        "dport": PORT,
        "family": FAMILY,
        "netns": U32,
        "pid": U32,
        "comm": COMM,
        "state": Enum(TCP_STATES),
        "bytes_acked": COUNTER,
        "bytes_received": COUNTER,
        "retrans_segs": COUNTER,
        "bytes_acked_delta": COUNTER,
        "bytes_received_delta": COUNTER,
        "retrans_segs_delta": COUNTER,
        "bytes_acked_rate": RATE,
        "bytes_received_rate": RATE,
        "srtt_us": U32,
        "cwnd": U32,
        "closed": Bool(),
    },
    optional={
        "state_changes": U32,
        "retrans_failed": COUNTER,
        "drops": COUNTER,
        "drops_delta": COUNTER,
        "last_drop_reason": REASON,
        "cookie": Int(1, 2**64 - 1),
        "job": Str(128),
        "zero_window": COUNTER,
        "zero_window_delta": COUNTER,
        "rto": COUNTER,
        "rto_delta": COUNTER,
        "accepted": Bool(),
    },
    doc={
        "saddr": "local address (IPv4 dotted or IPv6 text; an IPv6 socket talking IPv4 shows "
                 "`::ffff:a.b.c.d`)",
        "daddr": "remote address",
        "sport": "local port",
        "dport": "remote port",
        "family": "`ipv4` or `ipv6` (the socket's family)",
        "netns": "network namespace inode (`ls -l /proc/PID/ns/net`) of the owner process, "
                 "read when the flow is first reported; 0 when the owner is unknown or gone",
        "pid": "process (thread group) that owns the socket: the caller of connect(), or the "
               "first process that sent or received on it (kernels with sock:sock_send_length)"
               "; 0 when unknown (accepted connections on older kernels)",
        "comm": "name of that process's thread; empty when unknown",
        "state": "TCP state after the last transition seen",
        "bytes_acked": "bytes the peer acknowledged since the flow was first seen (advance of "
                       "snd_una on segments received in ESTABLISHED state; acks that arrive "
                       "after this side sent its FIN are not seen)",
        "bytes_received": "bytes the application read (sock:sock_recv_length), or on kernels "
                          "without it the payload of incoming segments, duplicates included "
                          "(see `features`)",
        "retrans_segs": "retransmitted skbs (tcp:tcp_retransmit_skb without error): segments "
                        "when TSO/GSO is off, else a lower bound of TcpRetransSegs",
        "bytes_acked_delta": "bytes_acked since the previous report (all of it for a flow new "
                             "in this interval)",
        "bytes_received_delta": "bytes_received since the previous report",
        "retrans_segs_delta": "retrans_segs since the previous report",
        "bytes_acked_rate": "bytes_acked_delta per second of the interval",
        "bytes_received_rate": "bytes_received_delta per second of the interval",
        "srtt_us": "smoothed RTT in microseconds at the last received segment; 0 before one",
        "cwnd": "congestion window in segments at the last received segment",
        "closed": "true exactly once, in the report after the connection reached CLOSE; the "
                  "flow is then forgotten",
        "state_changes": "state transitions seen",
        "retrans_failed": "retransmissions the kernel attempted but could not send",
        "drops": "skbs of this socket the kernel dropped (skb:kfree_skb with `rx_sk`)",
        "drops_delta": "drops since the previous report",
        "last_drop_reason": "reason of the last of those drops (kernel `enum skb_drop_reason` "
                            "name)",
        "cookie": "socket cookie (as `ss -e` prints after `sk:`, in hex there); absent until "
                  "the first received segment",
        "job": "job id of the owner process, from its environment (`C4_JOB_ID`, "
               "`SLURM_JOB_ID`, ... as for `nccl`), read when the flow is first reported; "
               "absent when unknown. C4D compares the connections of one job",
        "zero_window": "report intervals in which a segment from the peer found its receive "
                       "window at 0 (tcp:tcp_probe `snd_wnd`): our data filled the buffer of a "
                       "peer whose application does not read (stopped, hung, or slower than "
                       "the data); absent while 0 or on kernels without `snd_wnd`",
        "zero_window_delta": "zero_window since the previous report",
        "rto": "retransmission timeouts: the socket's retransmit timer expired with data "
               "unacknowledged (tcp:tcp_cong_state_set entering Loss, kernel 6.2+, see "
               "`features`: `rto`): a blackholed or stalled path, not a congestion drop that "
               "fast retransmit repaired; absent while 0",
        "rto_delta": "rto since the previous report",
        "accepted": "true when the kernel made this connection from a listening socket "
                    "(passive open, seen at SYN_RECV): its local port is the listener's and "
                    "only the connecting end's port picks the path (C4P leaves this end "
                    "unplanned); absent for connections this side opened and for those "
                    "older than the collector",
    },
)

SECTION = Record(
    required={
        "flows": List(FLOW, MAX_FLOWS_PER_REPORT),
        "omitted": U32,
        "tracked": U32,
        "map_full": COUNTER,
        "drops": Map(REASON, COUNTER, 512),
        "drops_delta": Map(REASON, COUNTER, 512),
    },
    optional={
        "unchanged": U32,
        "refresh": Bool(),
        "unattributed": U32,
        "closed_lost": COUNTER,
        "events_lost": COUNTER,
        "runs_missed": COUNTER,
        "events_suppressed": U32,
        "features": List(Str(32, r"[a-z0-9_]+"), 32),
        "owners": List(OWNER, MAX_OWNERS),
    },
    doc={
        "flows": "connections whose counters, state, RTT or owner changed since the "
                 "previous report, and closed ones; every tracked connection when `refresh` "
                 "is true. At most `max_report_flows`: when more changed, the most active "
                 "(bytes moved this interval, then retransmits)",
        "omitted": "changed flows not listed this interval (over `max_report_flows`); each "
                   "is listed in a later report even if idle by then, except closed ones, "
                   "which are forgotten unreported",
        "tracked": "flows in the kernel map now, closed ones of this interval included",
        "map_full": "insertions refused because the flow map held `max_flows` entries "
                    "(since the agent started; every event of an untracked flow retries)",
        "drops": "IPv4/IPv6 skbs dropped on this host by reason (skb:kfree_skb, all sockets "
                 "and none: e.g. `NETFILTER_DROP`, `TCP_OFOMERGE`), since the agent started; "
                 "`OTHER` collects reasons >= 255",
        "drops_delta": "drops since the previous report, non-zero reasons only",
        "unchanged": "tracked flows not listed because nothing changed since the previous "
                     "report: their counters are as last listed, their deltas and rates 0 "
                     "(0 when `refresh`)",
        "refresh": "true when `flows` lists every tracked flow, changed or not (the first "
                   "report, then every `refresh_intervals`-th): with `omitted` 0, a consumer "
                   "may forget this host's flows that it does not list",
        "unattributed": "flows hidden because a `pids`/`cgroup` filter is set and their owner "
                        "is not known yet",
        "closed_lost": "closed flows lost because the closed-flow map was full",
        "events_lost": "events the kernel could not queue (ring/perf buffer full)",
        "runs_missed": "runs of the collector's eBPF programs the kernel skipped because "
                       "another BPF program was running on the same CPU (a softirq "
                       "interrupting one), since the agent started: `drops`, retransmits and "
                       "state changes are lower bounds by up to this many",
        "events_suppressed": "events over `max_events` this interval, counted and not sent",
        "features": "optional kernel features in use, e.g. `ringbuf`, `rx_sk`, "
                    "`sock_length`, `send_reset`, `receive_reset`",
        "owners": "every process owning a tracked flow that carries a `job`, listed flows or "
                  "not, with its state read once per report: a job whose flows all stopped "
                  "moving while one of its processes is stopped (`T`) has a hung rank there. "
                  "At most 1024, lowest pids first; absent when none",
    },
)

FLOW_TUPLE = {"saddr": ADDR, "daddr": ADDR, "sport": PORT, "dport": PORT, "family": FAMILY,
              "pid": U32, "comm": COMM, "state": Enum(TCP_STATES)}
TUPLE_DOC = {"saddr": "local address", "daddr": "remote address", "sport": "local port",
             "dport": "remote port", "family": "`ipv4` or `ipv6`",
             "pid": "owner process, 0 if unknown", "comm": "owner name, empty if unknown",
             "state": "TCP state of the socket (`UNKNOWN` for a reset sent without one)"}

EVENTS: dict[str, Record] = {
    "tcp_retrans_burst": Record(
        required={**FLOW_TUPLE, "retrans": U32},
        doc={**TUPLE_DOC, "retrans": "retransmits on this flow within the interval when the "
                                     "event fired (the `retrans_burst` threshold)"},
    ),
    "tcp_reset": Record(
        required={**FLOW_TUPLE, "direction": Enum(("sent", "received"))},
        optional={"reason": REASON},
        doc={**TUPLE_DOC, "direction": "`sent` (tcp:tcp_send_reset) or `received` "
                                       "(tcp:tcp_receive_reset)",
             "reason": "why the kernel sent it (`enum sk_rst_reason` name, recent kernels)"},
    ),
}
