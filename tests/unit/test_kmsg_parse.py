"""agent/kmsg_parse.py: the /dev/kmsg record format and the hardware-fault messages."""
from __future__ import annotations

import pytest

from c4.agent.kmsg_parse import (
    XID_CODES, Malformed, classify, group_lines, parse_record, unescape,
)
from c4.core.wire import kinds


def event_body(m) -> dict:
    body = {"type": m.type, "severity": m.severity, "attrs": m.attrs, "device": m.device}
    return kinds.validate_body("event", body)


def test_record_header_dictionary_and_facility():
    r = parse_record(["3,1209,90114000321,-;pcieport 0000:5d:00.0: AER: x",
                      " SUBSYSTEM=pci", " DEVICE=+pci:0000:5d:00.0"])
    assert (r.facility, r.level, r.seq, r.ts_usec) == (0, 3, 1209, 90114000321)
    assert r.message == "pcieport 0000:5d:00.0: AER: x"
    assert r.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:5d:00.0"}
    user = parse_record(["12,5,6,-;hello from user space"])
    assert (user.facility, user.level) == (1, 4)


def test_header_with_caller_field_and_semicolons_in_message():
    r = parse_record(["6,77,100,-,caller=T4242;a; b; c"])
    assert r.seq == 77 and r.message == "a; b; c"


def test_escaped_bytes_are_decoded():
    assert unescape(r"tab\x09here \x5c done \xe2\x9c\x93") == "tab\there \\ done \u2713"
    assert parse_record([r"4,1,2,-;line\x0anext"]).message == "line\nnext"


@pytest.mark.parametrize("lines", [
    ["no header at all"], ["6,abc,1,-;seq is not a number"], ["6,1,2,-"], [""],
    [" KEY=orphan"], ["6,1,2,-;msg", " no equals sign"],
])
def test_malformed_records(lines):
    with pytest.raises(Malformed):
        parse_record(lines)


def test_group_lines_attaches_dictionary_lines():
    lines = [" orphan", "6,1,1,-;a", " K=v", "6,2,2,-;b", "6,3,3,-;c", " K=w", " L=x"]
    assert list(group_lines(lines)) == [[" orphan"], ["6,1,1,-;a", " K=v"], ["6,2,2,-;b"],
                                        ["6,3,3,-;c", " K=w", " L=x"]]


def test_xid_79_with_pid_and_name():
    m = classify("NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, "
                 "GPU has fallen off the bus.")
    assert (m.type, m.severity, m.device) == ("xid", "critical", "0000:3b:00")
    assert m.attrs == {"code": 79, "pci": "0000:3b:00", "pid": 1234, "process": "python",
                       "text": "GPU has fallen off the bus.", "meaning": XID_CODES[79][0]}
    event_body(m)


def test_xid_48_old_form_without_pid():
    m = classify("NVRM: Xid (PCI:0000:3B:00): 48, An uncorrectable double bit error (DBE) has "
                 "been detected on GPU in the framebuffer at partition 0, subpartition 0.")
    assert m.severity == "critical"
    assert (m.attrs["code"], m.attrs["pci"], m.attrs["pid"], m.attrs["process"]) == (
        48, "0000:3b:00", None, None)
    assert m.attrs["text"].startswith("An uncorrectable double bit error (DBE)")
    event_body(m)


def test_xid_63_unknown_pid_and_name():
    m = classify("NVRM: Xid (PCI:0000:3b:00): 63, pid='<unknown>', name=<unknown>, Row Remapper: "
                 "New row marked for remapping, reset gpu to activate.")
    assert (m.attrs["code"], m.attrs["pid"], m.attrs["process"]) == (63, None, None)
    assert m.attrs["text"].startswith("Row Remapper: New row marked")
    assert m.severity == "warning"
    event_body(m)


def test_xid_severity_table_and_unknown_code():
    for code in (79, 48, 95, 119):
        assert XID_CODES[code][1] == "critical"
    for code in (13, 31, 43):
        assert XID_CODES[code][1] == "warning"
    m = classify("NVRM: Xid (0000:3b:00): 9999, something new")
    assert m.severity == "warning" and "meaning" not in m.attrs and m.attrs["code"] == 9999
    event_body(m)


def test_mlx5_link_down_and_up():
    m = classify("mlx5_core 0000:5e:00.0 eth2: Link down")
    assert (m.type, m.severity, m.device) == ("nic_link", "error", "eth2")
    assert m.attrs == {"pci": "0000:5e:00.0", "netdev": "eth2", "state": "down"}
    up = classify("mlx5_core 0000:5e:00.0 ens2f0np0: Link up")
    assert up.attrs["state"] == "up" and up.severity == "info"
    event_body(m), event_body(up)


def test_mlx5_module_event():
    m = classify("mlx5_core 0000:5e:00.0: mlx5_port_module_event:1120:(pid 0): Port module "
                 "event[error]: module 0, Cable error, High Temperature")
    assert (m.type, m.severity, m.device) == ("nic_module", "error", "0000:5e:00.0")
    assert m.attrs == {"pci": "0000:5e:00.0", "module": 0, "status": "Cable error",
                       "text": "Cable error, High Temperature"}
    unplug = classify("mlx5_core 0000:5e:00.1: mlx5_port_module_event:1153:(pid 0): Port module "
                      "event: module 1, Cable unplugged")
    assert unplug.severity == "warning" and unplug.attrs["module"] == 1
    event_body(m), event_body(unplug)


@pytest.mark.parametrize("line,pci,port,severity,ev_sev", [
    ("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
     "0000:3b:00.0", "0000:00:01.0", "fatal", "critical"),
    ("pcieport 0000:00:01.0: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0",
     "0000:3b:00.0", "0000:00:01.0", "nonfatal", "error"),
    ("pcieport 0000:00:01.0: AER: Corrected error received: 0000:00:01.0",
     "0000:00:01.0", "0000:00:01.0", "corrected", "warning"),
    ("pcieport 0000:00:01.0: AER: Multiple Corrected error received: 0000:3b:00.0",
     "0000:3b:00.0", "0000:00:01.0", "corrected", "warning"),
    ("pcieport 0000:00:01.0: AER: Correctable error message received from 0000:3b:00.0",
     "0000:3b:00.0", "0000:00:01.0", "corrected", "warning"),
    ("pcieport 0000:00:01.0: AER: Uncorrectable (Fatal) error message received from 0000:3b:00.0",
     "0000:3b:00.0", "0000:00:01.0", "fatal", "critical"),
    ("pcieport 0000:00:01.0: PCIe Bus Error: severity=Uncorrected (Non-Fatal), "
     "type=Transaction Layer, (Requester ID)", "0000:00:01.0", None, "nonfatal", "error"),
    ("nvidia 0000:3b:00.0: PCIe Bus Error: severity=Correctable, type=Physical Layer, "
     "(Receiver ID)", "0000:3b:00.0", None, "corrected", "warning"),
])
def test_pcie_aer(line, pci, port, severity, ev_sev):
    m = classify(line)
    assert (m.type, m.severity, m.device) == ("pcie_aer", ev_sev, pci)
    assert (m.attrs["pci"], m.attrs["port"], m.attrs["severity"]) == (pci, port, severity)
    assert m.attrs["text"] == line
    event_body(m)


@pytest.mark.parametrize("line", [
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "mlx5_core 0000:5e:00.0:   device [15b3:1021] error status/mask=00004000/00000000",
    "EXT4-fs (nvme0n1p2): re-mounted. Quota mode: none.",
    "mlx5_core 0000:5e:00.0 eth2: Link downgraded",
    "",
])
def test_unrelated_messages(line):
    assert classify(line) is None
