"""Parsing kernel log records (/dev/kmsg) into typed hardware events. Pure functions.

Record format (Documentation/ABI/testing/dev-kmsg):

    <prio>,<seq>,<ts_usec>,<flags>[,<more>...];<message>\\n
     KEY=value\\n          (zero or more dictionary lines, each starting with a space)

prio is facility * 8 + level; non-printable bytes and backslash in the message are escaped as
\\xNN. The recognised messages are those the NVIDIA driver, mlx5_core and the PCIe AER driver
print (formats quoted next to each pattern).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

TEXT_MAX = 1024

_HEADER = re.compile(r"(\d{1,5}),(\d{1,20}),(\d{1,20}),[^;]*;(.*)", re.S)
_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")
_PCI = r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"

# Xid code -> (meaning, severity), from NVIDIA's "XID Errors" catalogue. Codes not listed are
# reported as warnings: the diagnosis decides from the code, the table only ranks alerts.
XID_CODES: dict[int, tuple[str, str]] = {
    13: ("Graphics engine exception (often an application fault)", "warning"),
    31: ("GPU memory page fault (often an application fault)", "warning"),
    43: ("GPU stopped processing (application fault or driver)", "warning"),
    45: ("Preemptive cleanup after a previous error", "warning"),
    48: ("Double-bit ECC error (DBE)", "critical"),
    61: ("Internal micro-controller breakpoint/warning", "error"),
    62: ("Internal micro-controller halt", "error"),
    63: ("ECC page retirement or row remapping recorded", "warning"),
    64: ("ECC page retirement or row remapping failure", "error"),
    74: ("NVLink error", "error"),
    79: ("GPU has fallen off the bus", "critical"),
    92: ("High single-bit ECC error rate", "warning"),
    94: ("Contained ECC error", "error"),
    95: ("Uncontained ECC error", "critical"),
    119: ("GSP RPC timeout", "critical"),
    120: ("GSP error", "critical"),
}

# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
# NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been ...
# NVRM: Xid (PCI:0000:3b:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: ...
_XID = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}"
                  r"(?:\.[0-7])?)\): (\d{1,5}), (.*)", re.S)
_XID_PROC = re.compile(r"pid=([^,]*), name=([^,]*), (.*)", re.S)
# mlx5_core 0000:5e:00.0 eth2: Link down
_MLX5_LINK = re.compile(rf"mlx5_core ({_PCI}) ([^\s:]+): Link (up|down)\s*")
# mlx5_core 0000:5e:00.0: mlx5_port_module_event:1120:(pid 0): Port module event[error]:
#   module 0, Cable error, High Temperature
_MLX5_MODULE = re.compile(rf"mlx5_core ({_PCI}): .*?Port module event(?:\[(\w+)\])?: "
                          r"module (\d{1,3}), (.*)", re.S)
# pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0      (< 6.x)
# pcieport 0000:00:01.0: AER: Correctable error message received from 0000:3b:00.0  (6.x)
_AER_RECEIVED = re.compile(
    rf"\S+ ({_PCI}): AER: (?:Multiple )?(Corrected|Correctable|Uncorrected|Uncorrectable)"
    rf"(?: \((Fatal|Non-Fatal)\))? error (?:message )?received(?::| from) ?({_PCI})?", re.S)
# nvidia 0000:3b:00.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction
#   Layer, (Requester ID)
_AER_BUS_ERROR = re.compile(
    rf"\S+ ({_PCI}): PCIe Bus Error: severity=(Corrected|Correctable|Uncorrected|Uncorrectable)"
    r"(?: \((Fatal|Non-Fatal)\))?, type=([^,]+)", re.S)
AER_EVENT_SEVERITY = {"corrected": "warning", "nonfatal": "error", "fatal": "critical"}


class Malformed(ValueError):
    """A record that is not in the /dev/kmsg format."""


@dataclass(frozen=True)
class KmsgRecord:
    facility: int  # 0: kernel; user space writing to /dev/kmsg gets 1 (user) by default
    level: int
    seq: int
    ts_usec: int
    message: str
    fields: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    type: str
    severity: str
    attrs: dict[str, Any]
    device: str | None


def unescape(text: str) -> str:
    raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), text.encode("utf-8", "replace"))
    return raw.decode("utf-8", "replace")


def parse_record(lines: list[str]) -> KmsgRecord:
    """One record: its header line and its dictionary lines."""
    m = _HEADER.fullmatch(lines[0].rstrip("\n")) if lines else None
    if m is None:
        raise Malformed(f"not a kmsg record header: {lines[0][:80]!r}" if lines else "empty")
    prio, seq, ts, message = int(m.group(1)), int(m.group(2)), int(m.group(3)), m.group(4)
    fields = {}
    for line in lines[1:]:
        key, sep, value = line.strip().partition("=")
        if not line.startswith(" ") or not sep:
            raise Malformed(f"bad dictionary line in record {seq}: {line[:80]!r}")
        fields[key] = value
    return KmsgRecord(prio >> 3, prio & 7, seq, ts, unescape(message), fields)


def group_lines(lines: Iterable[str]) -> Iterator[list[str]]:
    """Group a stream of lines into records: a header line and the space-led lines after it.
    A space-led line with no header before it is yielded alone (and fails parse_record)."""
    record: list[str] = []
    for line in lines:
        if line.startswith(" ") and record:
            record.append(line)
            continue
        if record:
            yield record
        record = [line]
    if record:
        yield record


def _pci(text: str) -> str:
    return text.lower()


def _text(text: str) -> str:
    return text.strip()[:TEXT_MAX]


def _xid(m: re.Match[str]) -> Match:
    code = int(m.group(2))
    pid: int | None = None
    process: str | None = None
    text = m.group(3)
    proc = _XID_PROC.match(text)
    if proc is not None:
        raw_pid, raw_name, text = proc.groups()
        raw_pid = raw_pid.strip("'\"")
        pid = int(raw_pid) if raw_pid.isdigit() and int(raw_pid) < 2**31 else None
        process = None if raw_name in ("", "<unknown>") else raw_name[:64]
    meaning, severity = XID_CODES.get(code, (None, "warning"))
    attrs: dict[str, Any] = {"code": code, "pci": _pci(m.group(1)), "pid": pid,
                             "process": process, "text": _text(text)}
    if meaning is not None:
        attrs["meaning"] = meaning
    return Match("xid", severity, attrs, attrs["pci"])


def _module(m: re.Match[str]) -> Match:
    level, module, text = m.group(2), int(m.group(3)), _text(m.group(4))
    status = text.split(",", 1)[0].strip()
    severity = ("error" if level == "error" or status == "Cable error"
                else "warning" if status == "Cable unplugged" else "info")
    return Match("nic_module", severity, {"pci": _pci(m.group(1)), "module": module,
                                          "text": text, "status": status}, _pci(m.group(1)))


def aer_severity(kind: str, fatal: str | None) -> str:
    if kind in ("Corrected", "Correctable"):
        return "corrected"
    return "fatal" if fatal == "Fatal" else "nonfatal"


def classify(message: str) -> Match | None:
    """The event a kernel log message reports, or None for anything else."""
    if (m := _XID.match(message)) is not None:
        return _xid(m)
    if (m := _MLX5_LINK.fullmatch(message)) is not None:
        pci, netdev, state = _pci(m.group(1)), m.group(2)[:64], m.group(3)
        return Match("nic_link", "info" if state == "up" else "error",
                     {"pci": pci, "netdev": netdev, "state": state}, netdev)
    if (m := _MLX5_MODULE.match(message)) is not None:
        return _module(m)
    if (m := _AER_RECEIVED.match(message)) is not None:
        severity = aer_severity(m.group(2), m.group(3))
        port = _pci(m.group(1))
        pci = _pci(m.group(4)) if m.group(4) else port
        return Match("pcie_aer", AER_EVENT_SEVERITY[severity],
                     {"pci": pci, "severity": severity, "port": port, "text": _text(message)},
                     pci)
    if (m := _AER_BUS_ERROR.match(message)) is not None:
        severity = aer_severity(m.group(2), m.group(3))
        pci = _pci(m.group(1))
        return Match("pcie_aer", AER_EVENT_SEVERITY[severity],
                     {"pci": pci, "severity": severity, "port": None, "text": _text(message),
                      "layer": m.group(4).strip()[:64]}, pci)
    return None
