"""The kmsg collector reading fixture records (tests/fixtures/kmsg) from a regular file named
`kmsg` under an injected dev_root, the way it reads /dev/kmsg."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from c4.agent.collectors import CollectorUnavailable, OptionError, load
from c4.agent.collectors.base import Context
from c4.agent.collectors.kmsg import KmsgCollector
from tests.wire_check import validate_sample


def dev_root(fixtures: Path, tmp_path: Path, name: str) -> Path:
    shutil.copy(fixtures / "kmsg" / name, tmp_path / "kmsg")
    return tmp_path


def make(root: Path, **options) -> KmsgCollector:
    c = KmsgCollector(Context("h1", dev_root=root), options)
    c.start()
    return c


def valid(sample) -> None:
    validate_sample("kmsg", sample)


def test_registered_under_its_name():
    assert load("kmsg") is KmsgCollector


def test_history_turns_fixture_into_typed_events(fixtures, tmp_path):
    c = make(dev_root(fixtures, tmp_path, "gpu_host.kmsg"), history=True)
    s = c.collect(1.0)
    valid(s)
    xids = {e.attrs["code"]: e for e in s.events if e.type == "xid"}
    assert set(xids) == {79, 48, 63, 13}  # the user-space (facility 1) Xid 79 is not among them
    assert xids[79].attrs["pci"] == "0000:3b:00" and xids[79].attrs["pid"] == 1234
    assert xids[79].attrs["process"] == "python" and xids[79].severity == "critical"
    assert xids[79].msg.startswith("NVRM: Xid (PCI:0000:3b:00): 79")
    assert xids[48].attrs["pid"] is None and xids[48].attrs["pci"] == "0000:86:00"
    assert xids[63].attrs["process"] is None and "Row Remapper" in xids[63].attrs["text"]

    links = [e for e in s.events if e.type == "nic_link"]
    assert [(e.attrs["state"], e.attrs["netdev"], e.attrs["pci"]) for e in links] == [
        ("up", "ens2f0np0", "0000:5e:00.0"), ("down", "ens2f0np0", "0000:5e:00.0")]
    assert links[1].device == "ens2f0np0"

    (module,) = [e for e in s.events if e.type == "nic_module"]
    assert module.attrs["module"] == 0 and module.attrs["status"] == "Cable error"

    aer = [e for e in s.events if e.type == "pcie_aer"]
    # each `error received` line and the `PCIe Bus Error` line detailing it make one event
    assert [(e.attrs["pci"], e.attrs["severity"], e.attrs["port"], e.attrs.get("layer"))
            for e in aer] == [
        ("0000:5e:00.0", "fatal", "0000:5d:00.0", "Transaction Layer"),
        ("0000:3b:00.0", "corrected", "0000:00:01.0", "Physical Layer"),
        ("0000:86:00.0", "nonfatal", None, "Transaction Layer")]
    assert aer[0].severity == "critical" and aer[0].device == "0000:5e:00.0"

    sec = s.section
    assert sec["records"] == sec["events"] + sec["ignored"] + sec["malformed"]
    assert sec["malformed"] == 0 and sec["overwritten"] == 0
    assert sec["by_type"] == {"xid": 4, "nic_link": 2, "nic_module": 1, "pcie_aer": 3}
    assert sum(sec["by_type"].values()) == len(s.events)


def test_garbage_is_counted_and_reading_goes_on(fixtures, tmp_path):
    c = make(dev_root(fixtures, tmp_path, "garbage.kmsg"), history=True)
    s = c.collect(1.0)
    valid(s)
    assert [(e.type, e.attrs["code"]) for e in s.events] == [("xid", 79), ("xid", 94)]
    sec = s.section
    assert sec["malformed"] == 5 and sec["ignored"] == 1 and sec["events"] == 2
    # parsed seqs 2001, 2003, 2010: 1 + 6 records never seen
    assert sec["overwritten"] == 7


def test_tail_mode_reports_only_new_records(fixtures, tmp_path):
    root = dev_root(fixtures, tmp_path, "gpu_host.kmsg")
    c = make(root)
    s = c.collect(1.0)
    assert s.events == [] and s.section["records"] == 0
    with open(root / "kmsg", "a") as f:
        f.write("4,1300,91000000000,-;NVRM: Xid (PCI:0000:af:00): 79, pid=99, name=python3, "
                "GPU has fallen off the bus.\n")
        f.write("6,1301,91000000100,-;mlx5_core 0000:d8:00.1 ens8f1np1: Link do")  # partial
    s = c.collect(2.0)
    valid(s)
    assert [(e.type, e.attrs["pci"]) for e in s.events] == [("xid", "0000:af:00")]
    with open(root / "kmsg", "a") as f:
        f.write("wn\n SUBSYSTEM=pci\n DEVICE=+pci:0000:d8:00.1\n")
    s = c.collect(3.0)
    assert [(e.type, e.attrs["netdev"], e.attrs["state"]) for e in s.events] == [
        ("nic_link", "ens8f1np1", "down")]
    assert s.section["records"] == 2 and s.section["overwritten"] == 0
    assert c.collect(4.0).events == []
    c.close()


def test_missing_device_is_unavailable(tmp_path):
    c = KmsgCollector(Context("h1", dev_root=tmp_path), {})
    with pytest.raises(CollectorUnavailable, match="kmsg does not exist"):
        c.start()


@pytest.mark.parametrize("options,key", [
    ({"history": "yes"}, "collectors.kmsg.history"),
    ({"histroy": True}, "collectors.kmsg.histroy"),
])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(OptionError, match=key.replace(".", r"\.")):
        KmsgCollector(Context("h1"), options)
