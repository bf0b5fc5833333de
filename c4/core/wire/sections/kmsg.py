"""`kmsg` section and events: hardware faults the kernel log reports (NVIDIA Xid, mlx5 link and
cable/module events, PCIe AER), read from /dev/kmsg. The section only counts records; each
recognised message becomes one event (docs/collectors.md#collectors-rdma-pfc-kmsg).
"""
from __future__ import annotations

from ..schema import COUNTER, Enum, Int, Map, Nullable, Record, Str

PCI = Str(16, r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}(\.[0-7])?")
TEXT = Str(1024)
EVENT_TYPE = Str(64, r"[a-z_]+")

SECTION = Record(
    required={
        "records": COUNTER,
        "events": COUNTER,
        "ignored": COUNTER,
        "malformed": COUNTER,
        "overwritten": COUNTER,
    },
    optional={"by_type": Map(EVENT_TYPE, COUNTER, 64)},
    doc={
        "records": "kernel log records read since the agent started",
        "events": "records recognised as a hardware fault (an AER `PCIe Bus Error` line that "
                  "details the `error received` line before it is folded into that event)",
        "ignored": "records of no interest (other messages, or not from the kernel: user "
                   "space writes to /dev/kmsg with a non-kernel facility)",
        "malformed": "records not in the /dev/kmsg format (rejected, reading goes on)",
        "overwritten": "records the kernel ring buffer overwrote before they were read (EPIPE; "
                       "counted from the sequence-number gap)",
        "by_type": "events by type since the agent started",
    },
)

EVENTS: dict[str, Record] = {
    "xid": Record(
        required={"code": Int(0, 65535), "pci": PCI, "pid": Nullable(Int(0, 2**31 - 1)),
                  "process": Nullable(Str(64)), "text": TEXT},
        optional={"meaning": Str(128)},
        doc={"code": "Xid error code (79: fallen off the bus, 48: DBE, 63: row remapping, ...)",
             "pci": "GPU PCI address as the driver prints it, e.g. `0000:3b:00`",
             "pid": "process the driver blames, nil when unknown or not printed",
             "process": "its name, nil when unknown or not printed",
             "text": "the driver's description after the code (and pid/name)",
             "meaning": "the code's meaning from the agent's table of well-known codes"},
    ),
    "nic_link": Record(
        required={"pci": PCI, "netdev": Str(64), "state": Enum(("up", "down"))},
        doc={"pci": "NIC PCI function, e.g. `0000:5e:00.0`", "netdev": "its netdev",
             "state": "`up` or `down`"},
    ),
    "nic_module": Record(
        required={"pci": PCI, "module": Nullable(Int(0, 255)), "text": TEXT},
        optional={"status": Str(64)},
        doc={"pci": "NIC PCI function", "module": "module (cage) number, nil if not printed",
             "text": "status and error, e.g. `Cable error, High Temperature`",
             "status": "`Cable plugged`, `Cable unplugged` or `Cable error`"},
    ),
    "pcie_aer": Record(
        required={"pci": PCI, "severity": Enum(("corrected", "nonfatal", "fatal")),
                  "port": Nullable(PCI), "text": TEXT},
        optional={"layer": Str(64)},
        doc={"pci": "the device reported as the error source when present, else the port",
             "severity": "`corrected`, `nonfatal` (uncorrected non-fatal) or `fatal`",
             "port": "the root/downstream port that received the error message, nil when the "
                     "line is printed by the device itself (`PCIe Bus Error`)",
             "text": "the kernel log line",
             "layer": "`Physical Layer`, `Data Link Layer` or `Transaction Layer` when printed"},
    ),
}
