"""`rdma` section: per-port InfiniBand/RoCE counters from sysfs, with deltas and rates.

`port_xmit_data` and `port_rcv_data` count 4-octet words (IBTA PortCounters); their byte rates
are given as `rates.port_xmit_bytes` and `rates.port_rcv_bytes`.
"""
from __future__ import annotations

from ..names import COUNTER_NAME, IDENT
from ..schema import COUNTER, Float, I64, Int, List, Map, Nullable, Record, Str

NAME = IDENT

PORT = Record(
    required={
        "dev": NAME,
        "port": Int(1, 255),
        "state": Str(32),
        "counters": Map(COUNTER_NAME, COUNTER, 512),
    },
    optional={
        "phys_state": Str(32),
        "rate_gbps": Float(0, 1e5),
        "netdev": Nullable(NAME),
        "deltas": Map(COUNTER_NAME, I64, 512),
        "rates": Map(COUNTER_NAME, Float(), 512),
        "resets": List(COUNTER_NAME, 512),
        "link_layer": Str(32),
        "pci": Nullable(NAME),
        "unreadable": List(COUNTER_NAME, 512),
    },
    doc={
        "dev": "RDMA device name (`/sys/class/infiniband/<dev>`)",
        "port": "port number",
        "state": "port state as sysfs prints it without the number, e.g. `ACTIVE`, `DOWN`",
        "counters": "raw values of `counters/*` and `hw_counters/*`, by file name",
        "phys_state": "physical state, e.g. `LinkUp`, `Disabled`",
        "rate_gbps": "link rate in Gb/s",
        "netdev": "the Ethernet netdev of a RoCE port",
        "deltas": "change since the previous report (absent on the first sample)",
        "rates": "deltas per second over the measured interval, plus `port_xmit_bytes` and "
                 "`port_rcv_bytes` (the 4-octet data counters times 4)",
        "resets": "counters that went backwards (reset or wrap): their delta is the new value",
        "link_layer": "`Ethernet` (RoCE) or `InfiniBand`",
        "pci": "PCI address of the device, e.g. `0000:3b:00.0`",
        "unreadable": "counter files that exist but could not be read or parsed this interval",
    },
)

SECTION = Record(required={"ports": List(PORT, 1024)},
                 doc={"ports": "one entry per device port; empty when the host has no "
                               "/sys/class/infiniband (RDMA driver not loaded)"})

EVENTS: dict[str, Record] = {
    "port_state": Record(
        required={"dev": NAME, "port": Int(1, 255), "from": Str(32), "to": Str(32)},
        doc={"dev": "device", "port": "port", "from": "previous state", "to": "new state"},
    ),
    "link_flap": Record(
        required={"dev": NAME, "port": Int(1, 255), "count": Int(1, 2**63 - 1)},
        optional={"netdev": Nullable(NAME)},
        doc={"dev": "device", "port": "port",
             "count": "link_downed increase over the interval (times the link went down)",
             "netdev": "the port's netdev"},
    ),
    "port_added": Record(
        required={"dev": NAME, "port": Int(1, 255), "state": Str(32)},
        doc={"dev": "device", "port": "port that appeared after the agent started",
             "state": "its state"},
    ),
    "port_removed": Record(
        required={"dev": NAME, "port": Int(1, 255)},
        doc={"dev": "device", "port": "port that disappeared (device unbound, driver unloaded)"},
    ),
}
