"""Two network namespaces joined by a veth pair, nftables loss on the receiver, and a root-netns
veth pair: shared by the root tests that run real TCP traffic or read a real netdev."""
from __future__ import annotations

import os
import random
import secrets
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

NFT_TABLE = "c4tf"


def sh(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


def free_port() -> int:
    """A port for a listener in a namespace made by the test (nothing else listens there)."""
    return random.randint(20000, 30000)


@dataclass
class Pair:
    a: str  # sender namespace
    b: str  # receiver namespace
    addr_a: str
    addr_b: str

    def popen(self, ns: str, code: str, *argv: str) -> subprocess.Popen[str]:
        return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", code, *argv],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def retrans_segs(self) -> int:
        lines = [ln.split() for ln in sh("ip", "netns", "exec", self.a, "cat",
                                         "/proc/net/snmp").splitlines() if ln.startswith("Tcp:")]
        return int(lines[1][lines[0].index("RetransSegs")])

    def tcp_timeouts(self) -> int:
        """TcpExt TCPTimeouts of the sender namespace: its retransmission timer expiries."""
        lines = [ln.split() for ln in sh("ip", "netns", "exec", self.a, "cat",
                                         "/proc/net/netstat").splitlines()
                 if ln.startswith("TcpExt:")]
        return int(lines[1][lines[0].index("TCPTimeouts")])

    def netns_inode(self, ns: str) -> int:
        return os.stat(f"/run/netns/{ns}").st_ino


@contextmanager
def netns_pair(prefix: str) -> Iterator[Pair]:
    """Namespaces `<prefix>-<tag>-a` and `-b` on one /24, deleted on exit even on failure."""
    tag = secrets.token_hex(3)
    a, b = f"{prefix}-{tag}-a", f"{prefix}-{tag}-b"
    net = f"10.{random.randint(100, 250)}.{random.randint(0, 255)}"
    p = Pair(a, b, f"{net}.1", f"{net}.2")
    try:
        for ns in (a, b):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", a, "link", "add", "va", "type", "veth", "peer", "name", "vb", "netns", b)
        for ns, dev, addr in ((a, "va", p.addr_a), (b, "vb", p.addr_b)):
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            # per-packet loss needs per-packet segments on the wire; TCP segments in software
            # even with gso off, and gso_max_segs 1 makes every skb one segment, so that a
            # retransmitted skb (what the tracepoint sees) is one segment (what the MIB counts)
            sh("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off",
               "gro", "off")
            sh("ip", "-n", ns, "link", "set", dev, "gso_max_segs", "1")
        yield p
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def drop_ingress(p: Pair, port: int, percent: int) -> None:
    """Drop `percent`% of the TCP segments to `port` arriving in the receiver namespace."""
    rules = (f"table inet {NFT_TABLE} {{\n chain in {{\n  type filter hook input priority 0;\n"
             f"  tcp dport {port} numgen random mod 100 < {percent} counter drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", p.b, "nft", "-f", "-"], input=rules, text=True,
                   check=True)


def blackhole(p: Pair, port: int, on: bool, acks: bool = False) -> None:
    """Drop (or stop dropping) every data segment to `port` arriving in the receiver namespace,
    the handshake and pure acks (short packets) passing; with `acks`, the other direction
    instead: every segment from `port` but the handshake's arriving in the sender namespace
    (all the receiver sends is acks)."""
    ns, match = (p.a, f"tcp sport {port} tcp flags & syn == 0") if acks else \
        (p.b, f"tcp dport {port} meta length > 200")
    rules = (f"table inet {NFT_TABLE}bh {{\n chain in {{\n  type filter hook input priority 0;\n"
             f"  {match} drop\n }}\n}}\n" if on else f"delete table inet {NFT_TABLE}bh\n")
    subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules, text=True,
                   check=True)


def nft_dropped(p: Pair) -> int:
    out = sh("ip", "netns", "exec", p.b, "nft", "list", "table", "inet", NFT_TABLE)
    return int(out.split("counter packets ")[1].split()[0])


@contextmanager
def root_veth(prefix: str) -> Iterator[str]:
    """A veth pair in the root namespace (the agent's); yields one end's name, both deleted on
    exit. `prefix` (<= 6 chars) keeps the name unique per test file under IFNAMSIZ."""
    name = f"{prefix}{secrets.token_hex(3)}"
    try:
        sh("ip", "link", "add", f"{name}a", "type", "veth", "peer", "name", f"{name}b")
        sh("ip", "link", "set", f"{name}a", "up")
        yield f"{name}a"
    finally:
        subprocess.run(["ip", "link", "del", f"{name}a"], capture_output=True)
