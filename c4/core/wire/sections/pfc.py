"""`pfc` section: priority flow control (pause) counters of the RoCE netdevs, from ethtool
statistics (`ethtool -S`), with deltas and rates.

Names are the driver's (mlx5: `rx_prio3_pause`, `tx_prio3_pause_duration` in microseconds,
`tx_pause_storm_error_events`, ...); see docs/collectors.md#collectors-rdma-pfc-kmsg.
"""
from __future__ import annotations

from ..names import IDENT
from ..schema import COUNTER, I64, Float, Int, List, Map, Nullable, Record, Str

NAME = IDENT
STAT_NAME = Str(64, r"[A-Za-z0-9_]+")

NETDEV = Record(
    required={"netdev": NAME, "counters": Map(STAT_NAME, COUNTER, 256)},
    optional={
        "dev": Nullable(NAME),
        "port": Nullable(Int(1, 255)),
        "deltas": Map(STAT_NAME, I64, 256),
        "rates": Map(STAT_NAME, Float(), 256),
        "resets": List(STAT_NAME, 256),
    },
    doc={
        "netdev": "network interface",
        "counters": "raw pause counters (empty when the driver has none, e.g. a veth)",
        "dev": "the RDMA device whose port this netdev is (absent for netdevs from the "
               "`netdevs` option)",
        "port": "that RDMA port",
        "deltas": "change since the previous report (absent on the first sample)",
        "rates": "deltas per second over the measured interval (`*_pause_duration`: "
                 "microseconds paused per second)",
        "resets": "counters that went backwards (reset or wrap): their delta is the new value",
    },
)

SECTION = Record(
    required={"netdevs": List(NETDEV, 1024)},
    optional={"unavailable": Map(NAME, Str(512), 1024)},
    doc={"netdevs": "one entry per netdev whose statistics were read",
         "unavailable": "netdev -> why its statistics could not be read this interval "
                        "(no such device, driver without stats); it is retried every interval"},
)

_STORM = {"netdev": NAME, "counter": STAT_NAME, "delta": Int(1, 2**63 - 1)}
_STORM_OPT = {"dev": Nullable(NAME), "port": Nullable(Int(1, 255))}
_STORM_DOC = {"netdev": "network interface", "counter": "the ethtool counter that increased",
              "delta": "its increase over the interval", "dev": "RDMA device",
              "port": "RDMA port"}

EVENTS: dict[str, Record] = {
    "pause_storm": Record(required=_STORM, optional=_STORM_OPT, doc=_STORM_DOC),
    "pause_storm_warning": Record(required=_STORM, optional=_STORM_OPT, doc=_STORM_DOC),
}
