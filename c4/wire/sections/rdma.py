"""`rdma` section: per-port InfiniBand/RoCE counters from sysfs, with deltas and rates."""
from __future__ import annotations

from ..schema import COUNTER, Float, I64, Int, List, Map, Nullable, Record, Str

NAME = Str(64, r"[A-Za-z0-9_.:\-]+")
COUNTER_NAME = Str(96, r"[A-Za-z0-9_]+")

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
        "rates": "deltas per second over the measured interval",
        "resets": "counters that went backwards (reset or wrap): their delta is the new value",
    },
)

SECTION = Record(required={"ports": List(PORT, 1024)}, doc={"ports": "one entry per device port"})

EVENTS: dict[str, Record] = {
    "port_state": Record(
        required={"dev": NAME, "port": Int(1, 255), "from": Str(32), "to": Str(32)},
        doc={"dev": "device", "port": "port", "from": "previous state", "to": "new state"},
    ),
}
