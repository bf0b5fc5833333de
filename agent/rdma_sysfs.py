"""Reading RDMA devices from `<sysfs_root>/class/infiniband`, laid out as the kernel's ib_core
creates it (drivers/infiniband/core/sysfs.c):

    class/infiniband/<dev>/{node_guid,fw_ver,board_id,hca_type}      (dev dir: often a symlink)
    class/infiniband/<dev>/device -> the PCI device, with net/<netdev>/dev_port and uevent
    class/infiniband/<dev>/ports/<N>/{state,phys_state,rate,link_layer}
    class/infiniband/<dev>/ports/<N>/{counters,hw_counters}/<name>     one decimal and newline
    class/infiniband/<dev>/ports/<N>/gids/<i>, gid_attrs/ndevs/<i>

Every read tolerates a missing or unreadable file (drivers return EINVAL/EOPNOTSUPP for
counters they do not implement, and empty GID slots have no ndev): the value is skipped.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from c4.core.wire.names import COUNTER_NAME, IDENT
from c4.core.wire.schema import Spec

IB_CLASS = Path("class/infiniband")
U64_MAX = 2**64 - 1
_RATE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
# Files in hw_counters/ that are settings, not counters (lifespan: counter cache time in ms).
NOT_COUNTERS = frozenset({"lifespan"})
UNKNOWN_STATE = "UNKNOWN"  # the state file could not be read


@dataclass(frozen=True)
class PortRef:
    dev: str
    port: int
    path: Path  # .../<dev>/ports/<N>

    @property
    def dev_dir(self) -> Path:
        return self.path.parent.parent


@dataclass
class PortStatus:
    state: str
    phys_state: str | None
    rate_gbps: float | None
    link_layer: str | None
    netdev: str | None


@dataclass
class DeviceInfo:
    dev: str
    node_guid: str | None
    fw_ver: str | None
    board_id: str | None
    hca_type: str | None
    pci: str | None
    ports: list[PortRef] = field(default_factory=list)


def read_text(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(4096).decode("ascii", "replace").strip()
    except OSError:
        return None


def valid_name(name: str | None) -> str | None:
    """The name if the wire can carry it, else None."""
    return name if name is not None and name and _fits(IDENT, name) else None


def parse_state(text: str | None) -> str | None:
    """`4: ACTIVE` -> `ACTIVE`, `5: LinkUp` -> `LinkUp`."""
    if not text:
        return None
    return text.split(":", 1)[1].strip() if ":" in text else text


def parse_rate(text: str | None) -> float | None:
    """`200 Gb/sec (4X HDR)` -> 200.0, `2.5 Gb/sec (1X SDR)` -> 2.5."""
    m = _RATE.match(text or "")
    return float(m.group(1)) if m else None


def list_devices(sysfs_root: Path) -> list[Path]:
    """Device directories in name order; empty when the class is absent (driver not loaded)."""
    base = sysfs_root / IB_CLASS
    try:
        entries = sorted(os.scandir(base), key=lambda e: e.name)
    except OSError:
        return []
    return [Path(e.path) for e in entries if e.is_dir()]  # is_dir() follows the symlink


def list_ports(dev_dir: Path) -> list[PortRef]:
    try:
        names = [e.name for e in os.scandir(dev_dir / "ports") if e.name.isdigit()]
    except OSError:
        return []
    return [PortRef(dev_dir.name, int(n), dev_dir / "ports" / n)
            for n in sorted(names, key=int) if 1 <= int(n) <= 255]


def all_ports(sysfs_root: Path) -> list[PortRef]:
    return [p for d in list_devices(sysfs_root) for p in list_ports(d)]


def _fits(spec: Spec, name: str) -> bool:
    """A name the wire accepts (one odd file or device name must not cost the whole section)."""
    try:
        spec.check(name)
    except ValueError:
        return False
    return True


def read_counters(port_dir: Path) -> tuple[dict[str, int], list[str]]:
    """Values of counters/* and hw_counters/*, and the names that could not be read."""
    values: dict[str, int] = {}
    unreadable: list[str] = []
    for sub in ("counters", "hw_counters"):
        try:
            entries = sorted(os.scandir(port_dir / sub), key=lambda e: e.name)
        except OSError:
            continue  # older HCAs have no hw_counters/
        for e in entries:
            if e.name in NOT_COUNTERS or not _fits(COUNTER_NAME, e.name):
                continue
            text = read_text(Path(e.path))
            try:
                value = int(text) if text is not None else -1
            except ValueError:
                value = -1
            if 0 <= value <= U64_MAX:
                values[e.name] = value
            else:
                unreadable.append(e.name)
    return values, unreadable


def read_gids(port_dir: Path) -> list[str]:
    """The non-zero GIDs in table order."""
    try:
        idx = sorted(int(e.name) for e in os.scandir(port_dir / "gids") if e.name.isdigit())
    except OSError:
        return []
    out = []
    for i in idx:
        gid = (read_text(port_dir / "gids" / str(i)) or "").lower()
        if gid and gid != _ZERO_GID and re.fullmatch(r"[0-9a-f]{4}(:[0-9a-f]{4}){7}", gid):
            out.append(gid)
    return out


def port_netdev(ref: PortRef, link_layer: str | None = None) -> str | None:
    """The netdev of a port: for RoCE the ndev of its first GID entry that has one (entry 0,
    the link-local GID, normally does); else the PCI device's netdev whose dev_port is port-1
    (IPoIB, or gid_attrs unreadable)."""
    if link_layer != "InfiniBand":  # IB GIDs have no ndev: skip 256 failing reads
        ndevs = ref.path / "gid_attrs" / "ndevs"
        try:
            idx = sorted(int(e.name) for e in os.scandir(ndevs) if e.name.isdigit())
        except OSError:
            idx = []
        for i in idx:
            name = read_text(ndevs / str(i))
            if name:
                return valid_name(name)
    net = ref.dev_dir / "device" / "net"
    try:
        names = sorted(e.name for e in os.scandir(net))
    except OSError:
        return None
    for name in names:
        dev_port = read_text(net / name / "dev_port")
        if dev_port is not None and dev_port.isdigit() and int(dev_port) == ref.port - 1:
            return valid_name(name)
    return valid_name(names[0]) if len(names) == 1 else None


def read_port_status(ref: PortRef) -> PortStatus:
    link_layer = read_text(ref.path / "link_layer") or None
    return PortStatus(
        state=parse_state(read_text(ref.path / "state")) or UNKNOWN_STATE,
        phys_state=parse_state(read_text(ref.path / "phys_state")),
        rate_gbps=parse_rate(read_text(ref.path / "rate")),
        link_layer=link_layer,
        netdev=port_netdev(ref, link_layer),
    )


def pci_address(dev_dir: Path) -> str | None:
    """The PCI address of a device, from the `device` link or its uevent (PCI_SLOT_NAME)."""
    for line in (read_text(dev_dir / "device" / "uevent") or "").splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            return valid_name(line.split("=", 1)[1])
    target = os.path.basename(os.path.realpath(dev_dir / "device"))
    return target if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", target) else None


def read_device(dev_dir: Path) -> DeviceInfo:
    return DeviceInfo(
        dev=dev_dir.name,
        node_guid=read_text(dev_dir / "node_guid") or None,
        fw_ver=read_text(dev_dir / "fw_ver") or None,
        board_id=read_text(dev_dir / "board_id") or None,
        hca_type=read_text(dev_dir / "hca_type") or None,
        pci=pci_address(dev_dir),
        ports=list_ports(dev_dir),
    )
