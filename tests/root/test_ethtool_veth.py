"""The real SIOCETHTOOL reader and the pfc collector against a veth pair in a network
namespace made for the test (veth has ethtool stats, but no pause counters)."""
from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import threading
from typing import Any, Callable

import pytest

from c4.agent.collectors.base import Context
from c4.agent.collectors.pfc import PfcCollector
from c4.agent.ethtool import EthtoolError, read_stats
from tests.wire_check import validate_section

CLONE_NEWNET = 0x40000000
NS = f"c4pfc-{os.getpid()}"
VETH, PEER = f"c4pv{os.getpid() % 100000}a", f"c4pv{os.getpid() % 100000}b"


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture
def netns():
    ip("netns", "add", NS)
    try:
        ip("-n", NS, "link", "add", VETH, "type", "veth", "peer", "name", PEER)
        ip("-n", NS, "link", "set", VETH, "up")
        ip("-n", NS, "link", "set", PEER, "up")
        yield NS
    finally:
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


def in_netns(ns: str, fn: Callable[[], Any]) -> Any:
    """Run fn in a thread that entered `ns` (setns moves only the calling thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    out: dict[str, Any] = {}

    def run() -> None:
        fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns")
            out["value"] = fn()
        except BaseException as exc:  # re-raised in the test's thread
            out["error"] = exc
        finally:
            os.close(fd)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_reader_returns_the_veth_stats(netns):
    stats = in_netns(netns, lambda: read_stats(VETH))
    (peer,) = json.loads(ip("-n", netns, "-j", "link", "show", PEER))
    assert stats["peer_ifindex"] == peer["ifindex"]  # names and values line up
    assert "rx_queue_0_xdp_packets" in stats
    listed = subprocess.run(["ip", "netns", "exec", netns, "ethtool", "-S", VETH], check=True,
                            capture_output=True, text=True).stdout
    names = [line.split(":")[0].strip() for line in listed.splitlines()[1:]]
    assert list(stats) == names


def test_reader_errors(netns):
    with pytest.raises(EthtoolError) as exc:
        in_netns(netns, lambda: read_stats("c4nosuchdev0"))
    assert exc.value.errno == errno.ENODEV and "No such device" in str(exc.value)
    with pytest.raises(EthtoolError) as exc:
        read_stats(VETH)  # this thread is in the initial namespace, the veth is not
    assert exc.value.errno == errno.ENODEV


def test_pfc_collector_on_veth_reports_no_pause_counters(netns):
    c = PfcCollector(Context("h1"), {"netdevs": [VETH, "c4nosuchdev0"]})
    c.start()
    samples = in_netns(netns, lambda: [c.collect(1.0), c.collect(2.0)])
    for s in samples:
        validate_section("pfc", s.section)
        assert s.events == []
        (entry,) = s.section["netdevs"]
        assert entry["netdev"] == VETH and entry["counters"] == {}
        assert list(s.section["unavailable"]) == ["c4nosuchdev0"]
        assert "No such device" in s.section["unavailable"]["c4nosuchdev0"]
    assert samples[1].section["netdevs"][0]["deltas"] == {}
