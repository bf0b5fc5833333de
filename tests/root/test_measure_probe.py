"""C4D's measuring probe on real Linux ECMP (the fabric of test_probe.py: h1 - r1 = {s1, s2} =
r2 - h2): datagrams TTL-limited to a spine cross one leaf's up link to it and the answers its
down link, so loss on r1=>s1 shows only in h1's leg via s1 and loss on s1=>r2 only in h2's
(its answers come down that link): the two candidates of a path finding, told apart."""
from __future__ import annotations

import subprocess
from typing import Any

from ._netns import sh
from .test_probe import Fabric, ecmp_fabric

MEASURE = r"""
import json, sys
from c4.agent.probe import Prober
dst, via = sys.argv[1], sys.argv[2]
p = Prober(rate=1000.0, burst=50.0)
m = p.measure(dst, list(range(40000, 40064)), ttl=2, count=300, via=(via,))
print(json.dumps(m.entry("leg", 2)))
"""


def drop(f: Fabric, router: str, dev: str, percent: int) -> None:
    """Drop `percent`% of what arrives at `router` on `dev` (netdev ingress: one direction)."""
    rules = (f"table netdev c4m {{\n chain in {{\n  type filter hook ingress device {dev} "
             f"priority 0;\n  numgen random mod 100 < {percent} drop\n }}\n}}\n")
    subprocess.run(["ip", "netns", "exec", f.ns[router], "nft", "-f", "-"], input=rules,
                   text=True, check=True)


def leg(f: Fabric, host: str, dst: str, spine: str) -> dict[str, Any]:
    leaf = "r1" if host == "h1" else "r2"
    # the spine answers from the interface the datagram came in by (inbound ifaddr)
    out: dict[str, Any] = f.run(host, MEASURE, dst, f.addr[f"{spine}-{leaf}"])
    assert "error" not in out, out
    assert out["sent"] == 300
    return out


def test_loss_up_to_the_spine_shows_in_one_leg_only() -> None:
    with ecmp_fabric() as f:
        h1, h2 = f.addr["h1-r1"], f.addr["h2-r2"]
        drop(f, "s1", "r1", 20)  # r1=>s1 loses 20 %
        up = leg(f, "h1", h2, "s1")
        assert 0.6 * 300 < up["answered"] < 0.95 * 300, up
        for other in (leg(f, "h1", h2, "s2"), leg(f, "h2", h1, "s1")):
            assert other["answered"] >= 297, other
        sh("ip", "netns", "exec", f.ns["s1"], "nft", "delete", "table", "netdev", "c4m")


def test_loss_down_from_the_spine_shows_in_the_far_leg() -> None:
    with ecmp_fabric() as f:
        h1, h2 = f.addr["h1-r1"], f.addr["h2-r2"]
        drop(f, "r2", "s1", 20)  # s1=>r2 loses 20 %: h2's answers from s1 come down it
        down = leg(f, "h2", h1, "s1")
        assert 0.6 * 300 < down["answered"] < 0.95 * 300, down
        assert leg(f, "h1", h2, "s1")["answered"] >= 297
        p50, p90, _ = down["rtt_us"]
        assert 0 < p50 <= p90
