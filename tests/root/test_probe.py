"""Path discovery on real Linux ECMP: h1 - r1 = {s1, s2} = r2 - h2 in network namespaces, r1 and
r2 hashing the 5-tuple over the two spines. Each trace must name the spine that the same
5-tuple's real packets cross, as the spines' interface counters show."""
from __future__ import annotations

import json
import random
import secrets
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from ._netns import sh

ROUTER_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv4.fib_multipath_hash_policy": "3",
    "net.ipv4.fib_multipath_hash_fields": "0x37",
    "net.ipv4.icmp_ratelimit": "0",
    "net.ipv4.icmp_errors_use_inbound_ifaddr": "1",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv6.conf.all.forwarding": "1",
    # the 5-tuple and not the flow label, as the IPv4 policy: with policy 1 (L4) a forwarded
    # packet's hash is the sender socket's random txhash (veth keeps skb->hash), so a TCP
    # connection's path had nothing to do with its ports (measured here: traced s1, sent s2)
    "net.ipv6.fib_multipath_hash_policy": "3",
    "net.ipv6.fib_multipath_hash_fields": "0x37",
    "net.ipv6.icmp.ratelimit": "0",
}


@dataclass
class Fabric:
    ns: dict[str, str]  # role -> namespace
    addr: dict[str, str]  # "<a>-<b>" -> a's address on the a-b link
    addr6: dict[str, str]  # the same, IPv6 (every link is dual-stack)
    net: str

    def spine_of_hop(self, hop: str | None) -> str | None:
        for spine in ("s1", "s2"):
            if hop in (self.addr[f"{spine}-r1"], self.addr6[f"{spine}-r1"]):
                return spine
        return None

    def rx_bytes(self, spine: str) -> int:
        out = sh("ip", "-n", self.ns[spine], "-j", "-s", "link", "show", "r1")
        return json.loads(out)[0]["stats64"]["rx"]["bytes"]

    def run(self, role: str, code: str, *argv: str, timeout: float = 60,
            wrap: tuple[str, ...] = ()) -> Any:
        proc = subprocess.run(["ip", "netns", "exec", self.ns[role], *wrap, sys.executable, "-c",
                               code, *argv], capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)


@contextmanager
def ecmp_fabric() -> Iterator[Fabric]:
    tag = secrets.token_hex(2)
    roles = ("h1", "r1", "s1", "s2", "r2", "h2")
    ns = {r: f"c4pr-{tag}-{r}" for r in roles}
    net = f"10.{random.randint(100, 250)}"
    links = [("h1", "r1"), ("r1", "s1"), ("r1", "s2"), ("s1", "r2"), ("s2", "r2"), ("r2", "h2")]
    net6 = f"fd{random.randint(0, 255):02x}:{random.randint(0, 65535):x}"
    addr: dict[str, str] = {}
    addr6: dict[str, str] = {}
    try:
        for r in roles:
            sh("ip", "netns", "add", ns[r])
            sh("ip", "-n", ns[r], "link", "set", "lo", "up")
        for i, (a, b) in enumerate(links):
            sh("ip", "-n", ns[a], "link", "add", b, "type", "veth", "peer", "name", a,
               "netns", ns[b])
            for j, (x, y) in enumerate(((a, b), (b, a))):
                addr[f"{x}-{y}"] = f"{net}.{i}.{j + 1}"
                addr6[f"{x}-{y}"] = f"{net6}:{i}::{j + 1}"
                sh("ip", "-n", ns[x], "addr", "add", f"{net}.{i}.{j + 1}/24", "dev", y)
                sh("ip", "-n", ns[x], "addr", "add", f"{net6}:{i}::{j + 1}/64", "dev", y,
                   "nodad")  # usable at once: no duplicate address detection
                sh("ip", "-n", ns[x], "link", "set", y, "up")
        for r in ("r1", "s1", "s2", "r2"):
            for k, v in ROUTER_SYSCTLS.items():
                sh("ip", "netns", "exec", ns[r], "sysctl", "-qw", f"{k}={v}")
        for v, a, h1_net, h2_net in (("-4", addr, f"{net}.0.0/24", f"{net}.5.0/24"),
                                     ("-6", addr6, f"{net6}:0::/64", f"{net6}:5::/64")):
            sh("ip", v, "-n", ns["h1"], "route", "add", "default", "via", a["r1-h1"])
            sh("ip", v, "-n", ns["h2"], "route", "add", "default", "via", a["r2-h2"])
            sh("ip", v, "-n", ns["r1"], "route", "add", h2_net, "nexthop", "via", a["s1-r1"],
               "nexthop", "via", a["s2-r1"])
            sh("ip", v, "-n", ns["r2"], "route", "add", h1_net, "nexthop", "via", a["s1-r2"],
               "nexthop", "via", a["s2-r2"])
            for s in ("s1", "s2"):
                sh("ip", v, "-n", ns[s], "route", "add", h1_net, "via", a["r1-" + s])
                sh("ip", v, "-n", ns[s], "route", "add", h2_net, "via", a["r2-" + s])
        yield Fabric(ns, addr, addr6, net)
    finally:
        for r in roles:
            subprocess.run(["ip", "netns", "del", ns[r]], capture_output=True)


TRACE = r"""
import json, sys
from c4.agent.probe import Prober
proto, dst, dport = sys.argv[1], sys.argv[2], int(sys.argv[3])
p = Prober(hop_timeout=0.5)
print(json.dumps([p.trace(proto, dst, int(s), dport=dport).entry("t") for s in sys.argv[4:]]))
"""

UDP_SEND = r"""
import json, socket, sys
dst, dport, sport, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("", sport))
for _ in range(n):
    s.sendto(b"x" * 64, (dst, dport))
print("null")
"""

TCP_LISTEN = r"""
import json, socket, sys, time
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("", int(sys.argv[1])))
ls.listen(8)
ls.settimeout(float(sys.argv[2]))
print("ready", flush=True)
accepted = 0
try:
    while True:
        c, _ = ls.accept()
        accepted += 1
        while c.recv(65536):
            pass
except socket.timeout:
    pass
print(accepted, flush=True)
"""

TCP_SEND = r"""
import json, socket, sys
dst, dport, sport, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("", sport))
s.connect((dst, dport))
for _ in range(n):
    s.sendall(b"x" * 1000)
s.close()
print("null")
"""


def busiest(delta: dict[str, int], payload: int) -> str:
    """The spine that carried a flow's `payload` bytes. Bytes, not packets: segments are
    coalesced (GSO, GRO), a CI run counted 69 packets for 300 sends."""
    busy = max(delta, key=lambda s: delta[s])
    assert delta[busy] >= payload and min(delta.values()) < delta[busy] / 10, delta
    return busy


def spine_taken(f: Fabric, send: str, *argv: str, packets: int = 200, size: int = 64) -> str:
    """Send real packets of `size` bytes with one 5-tuple and read which spine counted them."""
    before = {s: f.rx_bytes(s) for s in ("s1", "s2")}
    f.run("h1", send, *argv, str(packets))
    return busiest({s: f.rx_bytes(s) - before[s] for s in ("s1", "s2")}, packets * size)


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    with ecmp_fabric() as f:
        yield f


def test_roce_trace_names_the_spine_the_flow_takes(fabric: Fabric) -> None:
    f = fabric
    dst = f.addr["h2-r2"]
    sports = [49152 + 97 * i for i in range(12)]
    traces = f.run("h1", TRACE, "roce", dst, "4791", *map(str, sports))
    spines = set()
    for sport, t in zip(sports, traces):
        assert t["reached"] and "error" not in t, t
        assert len(t["hops"]) == 3
        assert t["hops"][0] == f.addr["r1-h1"] and t["hops"][2] in (f.addr["r2-s1"],
                                                                      f.addr["r2-s2"])
        spine = f.spine_of_hop(t["hops"][1])
        assert spine is not None, t
        spines.add(spine)
        if len(spines) <= 2 and sport in sports[:4]:
            assert spine_taken(f, UDP_SEND, dst, "4791", str(sport)) == spine
    assert spines == {"s1", "s2"}, "12 ports all hashed onto one spine: ECMP is not in play"
    # Paris traceroute: the same 5-tuple takes the same path every time
    again = f.run("h1", TRACE, "roce", dst, "4791", *map(str, sports))
    assert [t["hops"] for t in again] == [t["hops"] for t in traces]


def test_tcp_trace_stops_before_the_application(fabric: Fabric) -> None:
    f = fabric
    dst, dport = f.addr["h2-r2"], random.randint(20000, 30000)
    listener = subprocess.Popen(["ip", "netns", "exec", f.ns["h2"], sys.executable, "-c",
                                 TCP_LISTEN, str(dport), "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout and listener.stdout.readline().strip() == "ready"
        sports = [40000 + 13 * i for i in range(6)]
        traces = f.run("h1", TRACE, "tcp", dst, str(dport), *map(str, sports))
        # the listener must not have seen one probe connection
        accepted = int(listener.communicate(timeout=10)[0].strip())
        assert accepted == 0
    finally:
        if listener.poll() is None:
            listener.kill()
    for t in traces:
        assert "error" not in t and t["reached"] and len(t["hops"]) == 3, t
        assert f.spine_of_hop(t["hops"][1]) is not None
    # the real connection with the first port crosses the traced spine
    listener = subprocess.Popen(["ip", "netns", "exec", f.ns["h2"], sys.executable, "-c",
                                 TCP_LISTEN, str(dport), "5"], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout and listener.stdout.readline().strip() == "ready"
        for sport, t in list(zip(sports, traces))[:3]:
            taken = spine_taken(f, TCP_SEND, dst, str(dport), str(sport), packets=300,
                                size=1000)
            assert taken == f.spine_of_hop(t["hops"][1])
            time.sleep(0.1)
    finally:
        listener.kill()
        listener.wait()


COUNT_LISTEN = r"""
import socket, sys
ls = socket.socket(socket.AF_INET6)  # dual-stack: IPv4 connections arrive mapped
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("", int(sys.argv[1])))
ls.listen(1)
ls.settimeout(20)
print("ready", flush=True)
c, _ = ls.accept()
got = 0
while data := c.recv(65536):
    got += len(data)
print(got, flush=True)
"""

LIVE_TRACE = r"""
import json, socket, sys
from c4.agent.probe import Prober
dst, dport, sport, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET6 if ":" in dst else socket.AF_INET)
s.bind(("", sport))
s.connect((dst, dport))
s.sendall(b"x" * 1000)
trace = Prober(hop_timeout=0.5).trace("tcp", dst, sport, dport=dport).entry("t")
for _ in range(n):  # the connection still carries data after its own tuple was traced
    s.sendall(b"x" * 1000)
s.close()
print(json.dumps(trace))
"""


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_a_live_connections_own_port_is_traced_on_its_path(fabric: Fabric, family: str) -> None:
    """C4P must know the path a connection takes now to judge a plan's gain; its 4-tuple is
    taken, so the trace goes out on raw sockets and must not disturb the connection. IPv6:
    the segment is built with its own header (IPV6_HDRINCL) and the time-exceeded messages
    are ICMPv6."""
    f = fabric
    dst = (f.addr if family == "ipv4" else f.addr6)["h2-r2"]
    spines = set()
    base = 41000 if family == "ipv4" else 43000  # ports of the other run wait in TIME_WAIT
    for i, sport in enumerate(range(base, base + 13 * 16, 13)):
        if i >= 4 and len(spines) == 2:
            break
        dport = random.randint(20000, 30000)
        listener = subprocess.Popen(["ip", "netns", "exec", f.ns["h2"], sys.executable, "-c",
                                     COUNT_LISTEN, str(dport)], stdout=subprocess.PIPE,
                                    text=True)
        try:
            assert listener.stdout and listener.stdout.readline().strip() == "ready"
            before = {s: f.rx_bytes(s) for s in ("s1", "s2")}
            t = f.run("h1", LIVE_TRACE, dst, str(dport), str(sport), "300")
            delta = {s: f.rx_bytes(s) - before[s] for s in ("s1", "s2")}
            got = int(listener.communicate(timeout=20)[0].strip())
        finally:
            if listener.poll() is None:
                listener.kill()
                listener.wait()
        assert got == 301 * 1000
        assert "error" not in t and t["reached"] and len(t["hops"]) == 3, t
        spine = f.spine_of_hop(t["hops"][1])
        busy = busiest(delta, 301 * 1000)
        assert spine == busy, (t, delta)
        spines.add(spine)
    assert spines == {"s1", "s2"}, "16 ports all hashed onto one spine: ECMP is not in play"


def test_a_live_connections_port_without_cap_net_raw_is_an_error(fabric: Fabric) -> None:
    f = fabric
    dst, dport = f.addr["h2-r2"], random.randint(20000, 30000)
    listener = subprocess.Popen(["ip", "netns", "exec", f.ns["h2"], sys.executable, "-c",
                                 COUNT_LISTEN, str(dport)], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout and listener.stdout.readline().strip() == "ready"
        t = f.run("h1", LIVE_TRACE, dst, str(dport), "41300", "1",
                  wrap=("setpriv", "--bounding-set=-net_raw"))
        assert int(listener.communicate(timeout=20)[0].strip()) == 2000
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    assert "CAP_NET_RAW" in t["error"] and "live connection" in t["error"], t
    assert t["reached"] is False


def test_unreachable_destination_reports_the_router(fabric: Fabric) -> None:
    f = fabric
    t = f.run("h1", TRACE, "roce", f"{f.net}.9.9", "4791", "50000")[0]
    # r1 has no route to 9.9: it answers net unreachable (or h1's default route ends there)
    assert not t["reached"]
    assert "error" in t and "unreachable" in t["error"], t
