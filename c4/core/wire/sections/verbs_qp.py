"""`verbs_qp` section: the QPs of verbs applications (uprobes on libibverbs) with the RoCEv2
UDP source port each one uses, plus the kernel's own QP list (RDMA netlink)."""
from __future__ import annotations

from ..names import IDENT
from ..schema import COUNTER, U32, Bool, Enum, Int, List, Nullable, Record, Str

MAX_QPS_PER_REPORT = 10000
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN")
QP_TYPES = ("RC", "UC", "UD", "RAW_PACKET", "XRC_SEND", "XRC_RECV", "DRIVER", "UNKNOWN")
GID = Str(39, r"[0-9a-f]{4}(:[0-9a-f]{4}){7}")
NAME = IDENT

QP = Record(
    required={
        "pid": U32,
        "comm": Str(16),
        "lqpn": U32,
        "rqpn": Nullable(U32),
        "qp_type": Enum(QP_TYPES),
        "state": Enum(QP_STATES),
        "port": Nullable(Int(0, 255)),
        "dgid": Nullable(GID),
        "flow_label": Nullable(U32),
        "sport": Nullable(Int(0xC000, 0xFFFF)),
        "destroyed": Bool(),
    },
    optional={
        "exited": Bool(),
        "modifies": U32,
        "modify_failed": U32,
    },
    doc={
        "pid": "process (thread group) id that owns the QP, in the agent's pid namespace",
        "comm": "name of the thread that created (or first modified) the QP",
        "lqpn": "local QP number (`struct ibv_qp.qp_num`)",
        "rqpn": "remote QP number (`dest_qp_num` of the last successful modify with "
                "IBV_QP_DEST_QPN); nil until then",
        "qp_type": "`enum ibv_qp_type` name; `UNKNOWN` for a value this agent does not know",
        "state": "QP state after the last successful verb (`enum ibv_qp_state` name)",
        "port": "HCA port: `port_num` of IBV_QP_PORT, else `ah_attr.port_num` of IBV_QP_AV; "
                "nil until either was set",
        "dgid": "destination GID of the address vector (`ah_attr.grh.dgid`); nil until "
                "IBV_QP_AV was set",
        "flow_label": "GRH flow label the application set with the address vector (0: let the "
                      "kernel derive it); nil until IBV_QP_AV was set",
        "sport": "predicted RoCEv2 UDP source port (c4.core.roce.sport_for_qp) for RC/UC/XRC QPs "
                 "with a remote QP number and a global address vector; nil otherwise",
        "destroyed": "true once, in the report after the QP was destroyed (or its process "
                     "exited); the QP is then forgotten",
        "exited": "true when `destroyed` comes from the process exiting without "
                  "ibv_destroy_qp",
        "modifies": "successful ibv_modify_qp calls seen",
        "modify_failed": "ibv_modify_qp calls the provider refused (state left unchanged)",
    },
)

NETLINK_QP = Record(
    required={
        "dev": NAME,
        "port": Nullable(Int(0, 255)),
        "lqpn": U32,
        "rqpn": Nullable(U32),
        "qp_type": Str(32),
        "state": Str(16),
        "pid": Nullable(U32),
        "comm": Nullable(Str(64)),
    },
    doc={
        "dev": "RDMA device (`ifname` in `rdma -j res show qp`)",
        "port": "port; nil before the QP is bound to one",
        "lqpn": "local QP number",
        "rqpn": "remote QP number (RC and UC QPs only)",
        "qp_type": "QP type as `rdma` prints it (RC, UC, UD, GSI, XRC_INI, ...)",
        "state": "QP state as the hardware reports it (RESET ... ERR)",
        "pid": "owning process; nil for kernel QPs",
        "comm": "owning process name, or the kernel module for kernel QPs",
    },
)

STATS = Record(
    required={name: COUNTER for name in (
        "creates", "create_failed", "modifies", "modify_failed", "destroys", "destroy_failed",
        "map_full", "unreported", "read_failed", "netlink_errors", "netlink_rejected")},
    doc={
        "creates": "ibv_create_qp calls that returned a QP",
        "create_failed": "ibv_create_qp calls that returned NULL",
        "modifies": "successful ibv_modify_qp calls",
        "modify_failed": "failed ibv_modify_qp calls",
        "destroys": "successful ibv_destroy_qp calls",
        "destroy_failed": "failed ibv_destroy_qp calls",
        "map_full": "QPs not tracked because the eBPF map was full (option `max_qps`)",
        "unreported": "destroyed QPs whose number was reused before a report carried them",
        "read_failed": "verb calls whose arguments could not be read (bad pointers)",
        "netlink_errors": "failed `rdma res show qp` runs",
        "netlink_rejected": "QP objects in `rdma` output that could not be used",
    },
)

SECTION = Record(
    required={
        "qps": List(QP, MAX_QPS_PER_REPORT),
        "live": U32,
        "deferred": U32,
        "stats": STATS,
    },
    optional={
        "netlink": List(NETLINK_QP, MAX_QPS_PER_REPORT),
        "netlink_error": Str(512),
    },
    doc={
        "qps": "QPs that are new, changed or destroyed since the previous report, then "
               "unchanged live QPs in turn (at most option `max_report`): every live QP is "
               "repeated within live/max_report reports",
        "live": "QPs tracked now (not destroyed)",
        "deferred": "changed QPs left for the next report because of `max_report`",
        "stats": "counters since the collector started",
        "netlink": "the kernel's QP list (`rdma res show qp`), present when RDMA devices "
                   "exist; at most `max_report` entries",
        "netlink_error": "why the netlink listing failed this interval",
    },
)

EVENTS: dict[str, Record] = {}
