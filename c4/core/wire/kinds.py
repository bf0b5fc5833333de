"""Schemas of the envelope and of every kind's body (wire protocol v1)."""
from __future__ import annotations

from typing import Any

from .schema import (
    SECONDS, SEQ, U32, U64, Bool, Enum, Float, Int, Invalid, List, Map, Nullable, Record, Str,
)
from .names import IDENT
from .sections import EVENTS, SECTIONS

HOST = Str(253, r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
PORT16 = Int(0, 65535)

ENVELOPE = Record(
    required={
        "v": List(Int(0, 65535), 2, min_len=2),
        "kind": Str(32),
        "host": HOST,
        "boot": IDENT,
        "seq": SEQ,
        "ts": SECONDS,
        "body": Record({}, open=True),
    },
    optional={"floor": SEQ},
    doc={
        "v": "[major, minor] protocol version; a peer rejects an unknown major",
        "kind": "what the body is: hello, report, event, ack, plan, plan_result, probe, "
                "probe_result, error",
        "host": "sender's host name (the aggregator uses its own name in replies)",
        "boot": "sender incarnation: a random id chosen at process start; `seq` restarts at 1 "
                "under a new boot",
        "seq": "per (host, boot) sequence number, +1 per frame, starting at 1",
        "ts": "sender wall clock, seconds since the epoch",
        "body": "the kind's body (below)",
        "floor": "agent frames only: the lowest seq the sender still holds for resending, at "
                 "most `seq`; every seq below it is settled (stored, or dropped by a full agent "
                 "queue and lost)",
    },
)

HEALTH = Map(IDENT, Record(required={"ok": Bool()}, optional={"reason": Str(512)},
                           doc={"ok": "collector running", "reason": "why it is disabled"}), 64)

GID = Str(39, r"[0-9a-f]{4}(:[0-9a-f]{4}){7}")
INV_PORT = Record(
    required={"port": Int(1, 255), "state": Str(32)},
    optional={
        "link_layer": Str(32), "rate_gbps": Float(0, 1e5), "netdev": Nullable(IDENT),
        "gids": List(GID, 256), "rail": Nullable(Int(0, 1023)),
    },
    doc={"port": "port number", "state": "port state", "link_layer": "`Ethernet` or `InfiniBand`",
         "rate_gbps": "link rate", "netdev": "RoCE netdev", "gids": "non-zero GIDs in table order",
         "rail": "rail / plane index from config (nil if unknown)"},
)
INV_NIC = Record(
    required={"dev": IDENT, "ports": List(INV_PORT, 64)},
    optional={"node_guid": Str(32), "fw_ver": Str(64), "board_id": Str(64), "hca_type": Str(64),
              "pci": Nullable(IDENT)},
    doc={"dev": "RDMA device name", "ports": "its ports", "node_guid": "node GUID",
         "fw_ver": "firmware version", "board_id": "board id (cut to 64 characters)",
         "hca_type": "HCA type", "pci": "PCI address (domain:bus:device.function), so a PCIe AER names the NIC"},
)

HELLO = Record(
    required={
        "agent_version": Str(64),
        "interval": Float(0.01, 3600),
        "collectors": HEALTH,
        "nics": List(INV_NIC, 256),
    },
    optional={
        "kernel_boot_id": Str(64),
        "kernel": Str(128),
        "netdevs": List(Record(required={"name": IDENT}, optional={
            "mac": Str(32), "mtu": Int(0, 1 << 20), "addrs": List(Str(64), 64)},
            doc={"name": "interface", "mac": "hardware address", "mtu": "MTU",
                 "addrs": "IP addresses"}), 1024),
        "labels": Map(IDENT, Str(256), 64),
        "inventory_truncated": Int(0, 1 << 31),
    },
    doc={
        "agent_version": "agent software version",
        "interval": "report interval in seconds; the aggregator derives silence from it",
        "collectors": "collector name -> health",
        "nics": "RDMA devices and ports",
        "kernel_boot_id": "/proc/sys/kernel/random/boot_id (a reboot changes it)",
        "kernel": "kernel release",
        "netdevs": "network interfaces",
        "labels": "free-form labels from the agent config (rack, job scheduler node name)",
        "inventory_truncated": "inventory text fields cut to fit (e.g. a 72-character board_id)",
    },
)

SENDER = Record(
    required={"unacked": U64, "resent": U64, "dropped_queue_full": U64, "dropped_invalid": U64,
              "errors_received": U64, "reconnects": U64},
    optional={"sections_dropped": U64},
    doc={"unacked": "frames held for resending (not acked yet)",
         "resent": "frames sent again after `resend_after` without an ack, cumulative",
         "dropped_queue_full": "frames dropped because the queue was full (lost), cumulative",
         "dropped_invalid": "frames not sent because they failed validation or were rejected "
                            "by the aggregator, cumulative",
         "errors_received": "`error` frames received from the aggregator, cumulative",
         "reconnects": "times the agent dropped and re-created its socket, cumulative",
         "sections_dropped": "report sections and events of collectors fed by other processes "
                             "(the plugin socket) dropped because they failed the schema or "
                             "were too large; the rest of the report went out, cumulative"},
)

REPORT = Record(
    required={"interval": Float(0, 3600), "health": HEALTH},
    optional={"sender": SENDER, **SECTIONS},
    doc={"interval": "seconds covered by this report (measured, not configured)",
         "health": "collector name -> health",
         "sender": "the agent's delivery counters (docs/wire.md#envelope-and-delivery)",
         **{n: f"`{n}` section (below)" for n in SECTIONS}},
)

SEVERITY = Enum(("info", "warning", "error", "critical"))
EVENT_HEAD = Record(
    required={"type": Str(64), "severity": SEVERITY, "attrs": Record({}, open=True)},
    optional={"msg": Str(2048), "device": Nullable(Str(128))},
    doc={"type": "event type (below)", "severity": "info, warning, error or critical",
         "attrs": "the type's attributes (below)", "msg": "human text (e.g. the kernel log line)",
         "device": "the device it concerns (RDMA device, PCI address, netdev)"},
)

ACK = Record(
    required={"boot": IDENT, "seq": SEQ},
    doc={"boot": "the agent boot this ack is for",
         "seq": "highest seq such that every frame 1..seq of that boot is stored"},
)

ASSIGNMENT = Record(
    required={"id": IDENT, "proto": Enum(("roce", "tcp")), "sport": PORT16},
    optional={"dev": Nullable(IDENT), "lqpn": U32, "rqpn": U32, "pid": U32,
              "src": Str(64), "dst": Str(64), "dport": PORT16, "old_sport": PORT16},
    doc={"id": "assignment id, echoed in plan_result", "proto": "`roce` (a QP) or `tcp`",
         "sport": "UDP/TCP source port to use", "dev": "RDMA device of the QP",
         "lqpn": "local QP number", "rqpn": "remote QP number", "pid": "owning process",
         "src": "source address", "dst": "destination address", "dport": "destination port",
         "old_sport": "the port the planner believes the flow uses now"},
)
PLAN = Record(
    required={"plan_id": IDENT, "assignments": List(ASSIGNMENT, 65536)},
    optional={"epoch": U64, "reason": Str(256)},
    doc={"plan_id": "plan identifier", "assignments": "source-port assignments for this host",
         "epoch": "planner epoch; a lower epoch than one applied is ignored",
         "reason": "why the plan was made"},
)
PLAN_RESULT = Record(
    required={
        "plan_id": IDENT,
        "applied": List(Record(required={"id": IDENT, "sport": PORT16},
                               doc={"id": "assignment id", "sport": "port now in use"}), 65536),
        "failed": List(Record(required={"id": IDENT, "reason": Str(512)},
                              doc={"id": "assignment id", "reason": "why it failed"}), 65536),
    },
    doc={"plan_id": "the plan", "applied": "assignments in effect", "failed": "assignments not "
         "applied, with the reason (e.g. `EOPNOTSUPP` from the NIC firmware)"},
)
ADDR = Str(45, r"[0-9a-fA-F:.]+")
# Path discovery (C4P): the aggregator asks an agent to trace fixed 5-tuples with rising TTL
# (Paris-traceroute style); at most PROBE_SPORTS_MAX traced ports per frame keep the result
# inside one frame.
PROBE_SPORTS_MAX = 2048
PROBE_REQ = Record(
    required={"id": IDENT, "proto": Enum(("roce", "tcp")), "dst": ADDR,
              "sports": List(PORT16, 64)},
    optional={"src": ADDR, "dev": Nullable(IDENT), "dport": PORT16, "max_ttl": Int(1, 64),
              "measure": Record(
                  required={"count": Int(1, 1000), "ttl": Int(1, 64)},
                  optional={"via": List(ADDR, 16)},
                  doc={"count": "datagrams to send at the agent's measuring pace (200 a "
                                "second), without waiting for answers; fewer when the probe "
                                "rate the agent's legs share holds sending past 1.5 times "
                                "what that pace takes (the result's `sent`)",
                       "ttl": "their TTL: they stop at that hop, whose answers come back",
                       "via": "addresses the hop at `ttl` must answer from (a switch's); the "
                              "first of `sports` whose hop does is used"})},
    doc={"id": "probe id, echoed in every probe_result entry it produces",
         "proto": "`roce`: UDP datagrams to `dport` (default 4791), as RoCEv2 packets are "
                  "hashed; `tcp`: TCP SYNs to `dport` (the fabric hashes the IP protocol too), or on a live connection's own 4-tuple bare ACKs on a raw socket",
         "dst": "destination address (the peer NIC port's IP)",
         "sports": "source ports to trace, each with its own fixed 5-tuple",
         "src": "source address to bind (the local NIC port's IP); default: the route's",
         "dev": "local RDMA device or netdev the flow leaves by (informational)",
         "dport": "destination port; default 4791 for `roce`, required for `tcp`",
         "max_ttl": "highest TTL tried (default 8); tracing stops when the destination answers",
         "measure": "measure instead of trace (C4D, docs/diagnosis.md): loss and RTT of one "
                    "5-tuple up to the hop at `ttl` and back; one result entry"},
)
PROBE = Record(
    required={"probe_id": IDENT, "probes": List(PROBE_REQ, 256)},
    optional={"reason": Str(256)},
    doc={"probe_id": "request identifier, echoed in probe_result",
         "probes": f"destinations to trace; the sports of all probes together are at most "
                   f"{PROBE_SPORTS_MAX}",
         "reason": "why the aggregator asks (e.g. `new flows`, `link incident`)"},
)
PROBE_RESULT = Record(
    required={
        "probe_id": IDENT,
        "results": List(Record(
            required={"id": IDENT, "sport": PORT16, "hops": List(Nullable(ADDR), 64),
                      "reached": Bool()},
            optional={"error": Str(512), "sent": Int(0, 1000), "answered": Int(0, 1000),
                      "rtt_us": List(U32, 3), "elsewhere": Int(0, 1000)},
            doc={"id": "the probe's id", "sport": "the traced source port",
                 "hops": "address that answered TTL 1, 2, ... (the router's ICMP time-exceeded "
                         "source); nil where no answer came; routers only, not the destination",
                 "reached": "the destination is the hop after `hops`: it answered TTL "
                            "len(hops)+1 (UDP port unreachable), or every router up to its "
                            "measured distance answered (`tcp`, and RoCE NICs that answer "
                            "nothing)",
                 "sent": "measure: datagrams sent on the port (hops: the one at its TTL)",
                 "answered": "measure: of those, answered by that hop in time",
                 "rtt_us": "measure: RTT p50, p90, p99 of the answered, microseconds",
                 "elsewhere": "measure: ports tried whose hop at the TTL answered from another "
                              "switch than the wanted one (`via`); every port that answered "
                              "did, with none reaching it: that leaf no longer forwards to it",
                 "error": "why this port could not be traced (e.g. `EADDRINUSE`); hops then "
                          "hold what was learned before"}), PROBE_SPORTS_MAX),
    },
    doc={"probe_id": "the request", "results": "one entry per (probe, sport) traced"},
)
ERROR = Record(
    required={"code": Str(32), "reason": Str(1024)},
    optional={"ref_seq": Nullable(SEQ), "ref_boot": IDENT,
              "supported": List(Int(0, 65535), 16)},
    doc={"code": "a reject reason (docs/wire.md#rejections)", "reason": "human explanation",
         "ref_seq": "seq of the offending frame when known",
         "ref_boot": "boot of the offending frame when known (an agent resending an earlier "
                     "run's frames from its spool holds several boots)",
         "supported": "protocol majors the aggregator speaks (for unsupported_version)"},
)

BODIES: dict[str, Record] = {
    "hello": HELLO, "report": REPORT, "event": EVENT_HEAD, "ack": ACK, "plan": PLAN,
    "plan_result": PLAN_RESULT, "probe": PROBE, "probe_result": PROBE_RESULT, "error": ERROR,
}
# Which direction each kind travels: the aggregator rejects agent-bound kinds (every other
# kind in BODIES) from agents.
FROM_AGENT = frozenset({"hello", "report", "event", "plan_result", "probe_result"})


def validate_body(kind: str, body: Any) -> dict[str, Any]:
    spec = BODIES.get(kind)
    if spec is None:
        raise Invalid("kind", f"unknown kind {kind!r}")
    out = spec.check(body, "body")
    if kind == "event":
        attrs_spec = EVENTS.get(out["type"])
        if attrs_spec is None:
            raise Invalid("body.type", f"unknown event type {out['type']!r}")
        out["attrs"] = attrs_spec.check(out["attrs"], "body.attrs")
    return out
