"""Per-host RDMA sysfs trees for the lab's agents, laid out like mlx5's (agent/rdma_sysfs.py
reads them), and the pump that advances their counters from the host's real traffic.

The lab has no RDMA NIC: each host NIC is a veth carrying TCP. The tree makes the agent's
`rdma` collector see one mlx5 device per NIC, port 1, RoCE, whose files follow the veth:

| sysfs file | from (in the host's namespace) |
|---|---|
| ports/1/state, phys_state | the veth's operstate (`4: ACTIVE`/`5: LinkUp` or `1: DOWN`/`3: Disabled`) |
| counters/port_{xmit,rcv}_data | tx/rx bytes / 4 (the IB counters count 4-byte words) |
| counters/port_{xmit,rcv}_packets, unicast_* | tx/rx packets |
| counters/port_rcv_errors, port_xmit_discards | rx errors, tx drops |
| counters/link_downed | the veth's carrier-down count (a flap counts one) |
| hw_counters/out_of_sequence | TcpExt TCPOFOQueue: segments that arrived out of order (loss upstream) |
| hw_counters/local_ack_timeout_err | TcpExt TCPTimeouts: retransmission timeouts |
| hw_counters/roce_adp_retrans | Tcp RetransSegs |

The TCP counters are per namespace; a host with several NICs gets them split by each NIC's
share of the packets in the interval. ECN/CNP counters stay 0 (tbf does not mark).
"""
from __future__ import annotations

import os
import signal
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import NetNS

from . import netns
from .fabric import NicPlan

COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed",
            "link_error_recovery", "local_link_integrity_errors", "multicast_rcv_packets",
            "multicast_xmit_packets", "port_rcv_constraint_errors", "port_rcv_data",
            "port_rcv_errors", "port_rcv_packets", "port_rcv_remote_physical_errors",
            "port_rcv_switch_relay_errors", "port_xmit_constraint_errors", "port_xmit_data",
            "port_xmit_discards", "port_xmit_packets", "port_xmit_wait", "symbol_error",
            "unicast_rcv_packets", "unicast_xmit_packets")
HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "local_ack_timeout_err",
               "np_cnp_sent", "np_ecn_marked_roce_packets", "out_of_buffer", "out_of_sequence",
               "packet_seq_err", "req_cqe_error", "rnr_nak_retry_err", "roce_adp_retrans",
               "roce_adp_retrans_to", "roce_slow_restart", "rp_cnp_handled", "rp_cnp_ignored")
TCP_MIB = {"out_of_sequence": ("TcpExt", "TCPOFOQueue"),
           "local_ack_timeout_err": ("TcpExt", "TCPTimeouts"),
           "roce_adp_retrans": ("Tcp", "RetransSegs")}
PERIOD_S = 1.0  # the agents report once a second


def _gid(addr: str) -> str:
    """The RoCEv2 GID of an IPv4 address (IPv4-mapped IPv6)."""
    a, b, c, d = (int(x) for x in addr.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def write_atomic(path: Path, text: str) -> None:
    """Like a sysfs read, the agent never sees a half-written file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def make_tree(root: Path, nics: list[NicPlan], gbps: dict[str, float]) -> None:
    """`root/class/infiniband/<dev>/...` for each NIC of one host, all counters at 0."""
    for i, nic in enumerate(nics):
        dev = root / "class" / "infiniband" / nic.dev
        guid = f"c4{i:02x}:{zlib.crc32(nic.addr.encode()) & 0xffff:04x}:{nic.rail:04x}:0001"
        for name, value in (("node_guid", guid), ("sys_image_guid", guid),
                            ("fw_ver", "28.39.1002"), ("board_id", "MT_0000000838"),
                            ("hca_type", "MT4129"), ("node_type", "1: CA"),
                            ("node_desc", f"{nic.host} {nic.dev}")):
            _write(dev / name, value)
        pci = nic_pci(nic, i)
        _write(dev / "device" / "uevent", f"DRIVER=mlx5_core\nPCI_SLOT_NAME={pci}")
        _write(dev / "device" / "net" / nic.netdev / "dev_port", "0")
        port = dev / "ports" / "1"
        _write(port / "state", "4: ACTIVE")
        _write(port / "phys_state", "5: LinkUp")
        _write(port / "rate", f"{gbps.get(nic.dev, 0.4):g} Gb/sec (lab veth)")
        _write(port / "link_layer", "Ethernet")
        for g, (gid, kind) in enumerate((("fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2"),
                                         (_gid(nic.addr), "RoCE v2"))):
            _write(port / "gids" / str(g), gid)
            _write(port / "gid_attrs" / "ndevs" / str(g), nic.netdev)
            _write(port / "gid_attrs" / "types" / str(g), kind)
        for name in COUNTERS:
            _write(port / "counters" / name, "0")
        for name in HW_COUNTERS:
            _write(port / "hw_counters" / name, "0")


def nic_pci(nic: NicPlan, index: int) -> str:
    return f"0000:{0x40 + index:02x}:00.0"


@dataclass
class _Nic:
    plan: NicPlan
    port: Path
    written: dict[str, int] = field(default_factory=dict)
    carrier0: int | None = None  # carrier-down count when first seen (bringing the veth up)
    tcp: dict[str, int] = field(default_factory=dict)  # this NIC's share of the TCP counters
    packets: int = 0


def _mib(text: str) -> dict[tuple[str, str], int]:
    """/proc/net/{snmp,netstat}: header line then value line per group."""
    out: dict[tuple[str, str], int] = {}
    lines = text.splitlines()
    for head, vals in zip(lines[::2], lines[1::2]):
        group, _, names = head.partition(":")
        for n, v in zip(names.split(), vals.partition(":")[2].split()):
            try:
                out[(group, n)] = int(v)
            except ValueError:
                continue
    return out


class Pump:
    """Advances the trees of every host of a lab from its namespaces, every PERIOD_S."""

    def __init__(self, hosts: dict[str, tuple[str, Path, list[NicPlan]]]) -> None:
        # host -> (namespace, sysfs root, NICs)
        self.hosts = {h: (ns, [_Nic(n, root / "class/infiniband" / n.dev / "ports/1")
                               for n in nics]) for h, (ns, root, nics) in hosts.items()}
        self.mib: dict[str, dict[str, int]] = {}
        self._ipr: dict[str, Any] = {}  # namespace -> open netlink socket

    def close(self) -> None:
        for ipr in self._ipr.values():
            ipr.close()
        self._ipr.clear()

    def once(self) -> None:
        for host, (ns, nics) in self.hosts.items():
            try:
                self._host(host, ns, nics)
            except OSError:
                self._ipr.pop(ns, None)
                continue  # namespace going away (down in progress)

    def _host(self, host: str, ns: str, nics: list[_Nic]) -> None:
        with netns.inside(ns):
            mib = _mib(Path("/proc/thread-self/net/snmp").read_text())
            mib.update(_mib(Path("/proc/thread-self/net/netstat").read_text()))
        if ns not in self._ipr:
            self._ipr[ns] = NetNS(ns)
        links = {ln.get_attr("IFLA_IFNAME"): ln for ln in self._ipr[ns].get_links()}
        moved = {}
        for nic in nics:
            ln = links.get(nic.plan.netdev)
            if ln is None:
                continue
            st = ln.get_attr("IFLA_STATS64") or {}
            up = ln.get_attr("IFLA_OPERSTATE") == "UP"
            pk = int(st.get("tx_packets", 0)) + int(st.get("rx_packets", 0))
            moved[nic.plan.dev] = max(pk - nic.packets, 0)
            nic.packets = pk
            values = {
                "counters/port_xmit_data": int(st.get("tx_bytes", 0)) // 4,
                "counters/port_rcv_data": int(st.get("rx_bytes", 0)) // 4,
                "counters/port_xmit_packets": int(st.get("tx_packets", 0)),
                "counters/unicast_xmit_packets": int(st.get("tx_packets", 0)),
                "counters/port_rcv_packets": int(st.get("rx_packets", 0)),
                "counters/unicast_rcv_packets": int(st.get("rx_packets", 0)),
                "counters/port_rcv_errors": int(st.get("rx_errors", 0)),
                "counters/port_xmit_discards": int(st.get("tx_dropped", 0)),
                "counters/link_downed": self._downs(nic, ln),
            }
            self._put(nic, values)
            self._state(nic, up)
        total = sum(moved.values())
        prev = self.mib.setdefault(host, {})
        for name, key in TCP_MIB.items():
            now = mib.get(key, 0)
            delta = max(now - prev.get(name, now), 0)
            prev[name] = now
            for nic in nics:
                share = moved.get(nic.plan.dev, 0) / total if total else 1 / len(nics)
                nic.tcp[name] = nic.tcp.get(name, 0) + round(delta * share)
        for nic in nics:
            self._put(nic, {f"hw_counters/{k}": v for k, v in nic.tcp.items()})

    @staticmethod
    def _downs(nic: _Nic, ln: Any) -> int:
        count = int(ln.get_attr("IFLA_CARRIER_DOWN_COUNT") or 0)
        if nic.carrier0 is None:
            nic.carrier0 = count
        return count - nic.carrier0

    @staticmethod
    def _put(nic: _Nic, values: dict[str, int]) -> None:
        for rel, v in values.items():
            if nic.written.get(rel) != v:
                write_atomic(nic.port / rel, str(v))
                nic.written[rel] = v

    @staticmethod
    def _state(nic: _Nic, up: bool) -> None:
        state, phys = ("4: ACTIVE", "5: LinkUp") if up else ("1: DOWN", "3: Disabled")
        if nic.written.get("state") != int(up):
            write_atomic(nic.port / "state", state)
            write_atomic(nic.port / "phys_state", phys)
            nic.written["state"] = int(up)


def main(argv: list[str]) -> int:
    """`python -m c4.lab.sysfs STATE_DIR`: pump until SIGTERM (started by `c4 lab up`)."""
    from .state import LabState

    st = LabState.open_dir(Path(argv[0]))
    fab = st.fabric()
    pump = Pump({h: (fab.ns(h), st.host_dir(h) / "sys", fab.host_nics(h))
                 for h in fab.topology.hosts})
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    while not stop:
        pump.once()
        time.sleep(PERIOD_S)
    pump.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

