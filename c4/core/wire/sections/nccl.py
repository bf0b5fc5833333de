"""`nccl` section: per-communicator collective progress and per-connection timing, as the
NCCL profiler plugin (plugin/) summarises it in the training process every interval.

This is the contract between the plugin/agent side and the aggregator's diagnosis (C4D):
- progress (`seq_*`, `inflight`) shows which rank stopped advancing (hang);
- `peers` gives bytes and network-wait time per (peer, channel, direction): the aggregator's
  latency matrix is `net_wait_s / bytes` of each rank -> peer send connection (slow link/node);
- `entry_wait_s` is how long this rank waited, from entering an op, for its first data to move:
  the peers of a late rank wait, the late rank itself does not (straggler). Durations are
  measured on one host: nothing here compares clocks across hosts.
"""
from __future__ import annotations

from ..schema import U32, U64, Enum, Float, Int, List, Nullable, Record, Str

WAIT = Float(0, 1e7)
COMM = Str(16, r"[0-9a-f]{16}")  # communicator hash, 64-bit, lower-case hex
FUNC = Str(32, r"[A-Za-z]+")
DIR = Enum(("send", "recv"))

PEER = Record(
    required={
        "peer": Int(0, 1 << 24),
        "channel": Int(0, 1023),
        "dir": DIR,
        "bytes": U64,
        "steps": U64,
        "net_wait_s": WAIT,
    },
    optional={"peer_wait_s": WAIT, "gpu_wait_s": WAIT},
    doc={
        "peer": "the other rank of this connection",
        "channel": "NCCL channel",
        "dir": "`send` (this rank -> peer) or `recv` (peer -> this rank)",
        "bytes": "bytes moved over the interval",
        "steps": "proxy steps completed over the interval",
        "net_wait_s": "time in network wait states (SendWait / RecvWait: data in flight)",
        "peer_wait_s": "time waiting for the peer (SendPeerWait: receiver buffer credit); a victim "
                       "state, not a cause",
        "gpu_wait_s": "time waiting for the GPU (SendGPUWait / RecvFlushWait)",
    },
)

COLL = Record(
    required={"func": FUNC, "count": U32, "bytes": U64, "time_s": WAIT},
    optional={"algo": Str(32), "proto": Str(32)},
    doc={
        "func": "collective, e.g. `AllReduce`",
        "count": "operations completed over the interval",
        "bytes": "payload bytes of those operations",
        "time_s": "sum of their durations, start to completion (last ProxyOp or KernelCh stop)",
        "algo": "algorithm, e.g. `Ring`, `Tree`",
        "proto": "protocol, e.g. `Simple`, `LL`, `LL128`",
    },
)

INFLIGHT = Record(
    required={"seq": U64, "func": FUNC, "age_s": WAIT},
    optional={"progress_age_s": WAIT},
    doc={
        "seq": "sequence number of the oldest operation not yet complete",
        "func": "its collective",
        "age_s": "seconds since it started (on this host's clock)",
        "progress_age_s": "seconds since any proxy step of this communicator moved",
    },
)

COMM_SUMMARY = Record(
    required={
        "comm": COMM,
        "rank": Int(0, 1 << 24),
        "nranks": Int(1, 1 << 24),
        "seq_started": U64,
        "seq_completed": U64,
        "colls": List(COLL, 64),
        "peers": List(PEER, 8192),
    },
    optional={
        "pid": U32,
        "job": Nullable(Str(128)),
        "dev": Nullable(Int(0, 255)),
        "inflight": Nullable(INFLIGHT),
        "entry_wait_s": WAIT,
        "entry_ops": U32,
        "dropped_events": U64,
    },
    doc={
        "comm": "communicator hash (same on every rank of the communicator)",
        "rank": "this process's rank in the communicator",
        "nranks": "communicator size",
        "seq_started": "collectives started since the communicator was created",
        "seq_completed": "collectives completed since the communicator was created",
        "colls": "completed collectives over the interval, by function/algorithm/protocol",
        "peers": "per (peer, channel, direction) traffic and wait times over the interval",
        "pid": "training process id",
        "job": "job id from the process environment (SLURM_JOB_ID, C4_JOB_ID, ...)",
        "dev": "CUDA device index",
        "inflight": "oldest incomplete operation, nil when idle",
        "entry_wait_s": "sum over ops completed this interval of the time from entering the op to "
                        "its first data movement (peers of a straggler wait, it does not)",
        "entry_ops": "number of ops summed in entry_wait_s",
        "dropped_events": "profiler events the plugin dropped (buffers full), cumulative",
    },
)

SECTION = Record(
    required={"comms": List(COMM_SUMMARY, 1024)},
    optional={"malformed": U64, "dropped": U64, "plugin_unsent": U64},
    doc={"comms": "one summary per communicator of each training process on this host",
         "malformed": "plugin datagrams the agent rejected, cumulative",
         "dropped": "plugin datagrams the agent could not process, cumulative",
         "plugin_unsent": "datagrams the live training processes' plugins could not send (agent "
                          "absent or its socket full), cumulative as the plugins count them"},
)

WAITING = Record(
    required={"peer": Int(0, 1 << 24), "channel": Int(0, 1023), "dir": DIR, "state": Str(32)},
    optional={"idle_s": WAIT},
    doc={"peer": "the rank this one waits on", "channel": "channel", "dir": "direction",
         "state": "the proxy step state it is stuck in, e.g. `RecvWait`",
         "idle_s": "seconds since that connection last moved"},
)

EVENTS: dict[str, Record] = {
    "nccl_stall": Record(
        required={"comm": COMM, "rank": Int(0, 1 << 24), "nranks": Int(1, 1 << 24),
                  "seq": U64, "func": FUNC, "age_s": WAIT, "waiting": List(WAITING, 4096)},
        optional={"pid": U32, "job": Nullable(Str(128)), "seq_completed": U64},
        doc={"comm": "communicator", "rank": "stalled rank", "nranks": "size",
             "seq": "sequence number of the stalled operation", "func": "its collective",
             "age_s": "seconds with no progress", "waiting": "connections with no progress",
             "pid": "process", "job": "job id", "seq_completed": "last completed seq"},
    ),
}
