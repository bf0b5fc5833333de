"""Issue 3 "done when": one real agent with every host collector (host, rdma, pfc, kmsg,
tcp_flows, verbs_qp) reports through a real aggregator, and `c4 host NAME` shows all of it.

The world each collector reads is real down to the lowest layer the machine lacks: an mlx5
sysfs tree whose counters the test bumps, a kmsg file the test appends kernel records to, a
TCP flow with 2% nftables loss between two namespaces, a QP driven to RTS through the verbs
test library (uprobes), and a veth read with the real SIOCETHTOOL ioctl.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.e2e.procs import Cluster, wait_for
from tests.verbs import harness

from ._netns import Pair, drop_ingress, free_port, netns_pair, root_veth

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HOST = "gpu-all-01"
COLLECTORS = ("host", "rdma", "pfc", "kmsg", "tcp_flows", "verbs_qp")
BUMPED = "np_cnp_sent"  # on port 1
LQPN, RQPN, SPORT = 0x1FD2, 0x423C, 55701  # NCCL's flow label 0: mlx5 derives the port
DEADLINE = 40.0  # seconds for everything to show up once the traffic runs

STREAM_RECEIVER = r"""
import socket, sys
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(("0.0.0.0", int(sys.argv[1])))
ls.listen(1)
print("ready", flush=True)
c, _ = ls.accept()
while c.recv(1 << 20):
    pass
"""

# Sends until killed, ~6 MB/s: a steady flow (reported in every report, never closed) whose
# loss keeps retransmitting without loading the machine.
STREAM_SENDER = r"""
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
s.connect((sys.argv[1], int(sys.argv[2])))
buf = b"x" * 65536
while True:
    s.sendall(buf)
    time.sleep(0.01)
"""


@pytest.fixture(scope="module")
def built() -> None:
    harness.require("all")


@pytest.fixture
def pair() -> Iterator[Pair]:
    with netns_pair("c4all") as p:
        yield p


@pytest.fixture
def veth() -> Iterator[str]:
    with root_veth("c4all") as name:
        yield name


def _write_atomic(path: Path, text: str) -> None:
    """Like a sysfs read: the agent never sees a half-written counter file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextmanager
def bumping(counter: Path, by: int = 1000, every: float = 0.1) -> Iterator[None]:
    """Raise a counter file in the background, so that every report has a delta for it."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            _write_atomic(counter, f"{int(counter.read_text()) + by}\n")

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


@contextmanager
def tcp_stream(p: Pair, port: int) -> Iterator[int]:
    """A lossy TCP flow a -> b:port for as long as the block runs; yields the sender's pid."""
    drop_ingress(p, port, 2)
    procs = [p.popen(p.b, STREAM_RECEIVER, str(port))]
    try:
        assert procs[0].stdout is not None and procs[0].stdout.readline().strip() == "ready", \
            procs[0].stderr.read() if procs[0].stderr else ""
        procs.append(p.popen(p.a, STREAM_SENDER, p.addr_b, str(port)))
        yield procs[1].pid
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
            pr.communicate()


@contextmanager
def qp_in_rts() -> Iterator[int]:
    """A qp_driver holding one NCCL-like QP in RTS; yields its pid."""
    d = harness.Driver()
    try:
        for cmd in (f"create {LQPN:#x} RC", f"modify {LQPN:#x} INIT",
                    f"modify {LQPN:#x} RTR {RQPN:#x} 0 10.0.0.2", f"modify {LQPN:#x} RTS"):
            d.ok(cmd)
        yield d.pid
    finally:
        d.close()


def kmsg_records(path: Path) -> list[str]:
    """The records of a kmsg capture, each with its dictionary lines."""
    records: list[str] = []
    for line in path.read_text().splitlines(keepends=True):
        if line.startswith(" ") and records:
            records[-1] += line
        elif line.strip():
            records.append(line)
    return records


def gaps(d: dict[str, Any], port: int, veth: str, kmsg_count: int) -> list[str]:
    """What `c4 host --json` does not show yet (empty: everything is there)."""
    r = d.get("report") or {}
    missing = []
    ports = (r.get("rdma") or {}).get("ports", [])
    if not any(p.get("rates", {}).get(BUMPED, 0) > 0 for p in ports):
        missing.append(f"rdma rate of {BUMPED}")
    if not any(f["dport"] == port and f["retrans_segs"] > 0
               for f in (r.get("tcp_flows") or {}).get("flows", [])):
        missing.append(f"tcp flow to port {port} with retransmits")
    if not any(q["lqpn"] == LQPN and q["state"] == "RTS"
               for q in (r.get("verbs_qp") or {}).get("qps", [])):
        missing.append("QP in RTS")
    if not any(n["netdev"] == veth for n in (r.get("pfc") or {}).get("netdevs", [])):
        missing.append(f"pfc entry for {veth}")
    if (r.get("kmsg") or {}).get("records") != kmsg_count:
        missing.append(f"all {kmsg_count} kmsg records read")
    types = {e["type"] for e in d.get("events", [])}
    missing += [f"{t} event" for t in ("xid", "nic_link") if t not in types]
    return missing


def test_agent_with_every_collector_through_aggregator_and_cli(
        built: None, pair: Pair, veth: str, cluster: Cluster, tmp_path: Path) -> None:
    # (cluster last: its processes stop before the namespaces and the veth go away)
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs/mlx5_2port", sysfs, symlinks=True)
    (cnp,) = sysfs.glob(f"class/infiniband/*/ports/1/hw_counters/{BUMPED}")
    dev = tmp_path / "dev"
    dev.mkdir()
    kmsg = dev / "kmsg"
    kmsg.write_text("")
    port = free_port()

    cluster.start_aggregator()
    agent = cluster.start_agent(HOST, sysfs, interval=0.5, collectors=COLLECTORS, extra=(
        f'dev_root = "{dev}"\n'
        "[collectors.kmsg]\nhistory = false\n"
        f'[collectors.pfc]\nnetdevs = ["{veth}"]\n'
        # no burst events: they would crowd the aggregator's recent-events list
        f"[collectors.tcp_flows]\nports = [{port}]\nretrans_burst = 0\n"
        f'[collectors.verbs_qp]\nlibrary = "{harness.LIBRARY}"\n'))

    def health() -> dict[str, Any] | None:
        h = cluster.api(f"/api/v1/hosts/{HOST}")["report"]["health"]
        return h if set(h) == set(COLLECTORS) else None

    # eBPF programs compile at start (BCC): the probes must be in place before the traffic
    try:
        first = wait_for(health, timeout=60, what="the agent's first report")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{agent.output()[-3000:]}") from None
    off = {n: h.get("reason") for n, h in first.items() if not h["ok"]}
    assert not off, f"collectors off: {off}\n{agent.output()[-3000:]}"

    records = kmsg_records(FIXTURES / "kmsg/gpu_host.kmsg")
    before = int(cnp.read_text())
    with ExitStack() as running:
        running.enter_context(bumping(cnp))
        sender_pid = running.enter_context(tcp_stream(pair, port))
        driver_pid = running.enter_context(qp_in_rts())
        with kmsg.open("a") as f:  # as the kernel appends records while the agent follows
            f.write("".join(records))

        deadline = time.monotonic() + DEADLINE
        while True:
            out = cluster.cli("host", HOST, "--json")
            assert out.returncode == 0, out.stderr
            detail = json.loads(out.stdout)
            missing = gaps(detail, port, veth, len(records))
            if not missing:
                break
            assert time.monotonic() < deadline, (
                f"after {DEADLINE:.0f} s `c4 host --json` still lacks {missing}\n"
                f"{agent.output()[-3000:]}")
            time.sleep(0.2)
        human = cluster.cli("host", HOST)

    report = detail["report"]
    assert {n for n, h in report["health"].items() if h["ok"]} == set(COLLECTORS)
    assert report["host"]["mem_total_bytes"] > 0

    # rdma: both fixture ports with their counters; the bumped one moves at a real rate
    ports = {p["port"]: p for p in report["rdma"]["ports"]}
    assert set(ports) == {1, 2} and all(p["counters"] for p in ports.values())
    assert ports[1]["counters"][BUMPED] > before
    assert ports[1]["rates"][BUMPED] > 0 and ports[1]["deltas"][BUMPED] % 1000 == 0

    # tcp_flows: the sender's end, owned by the sender in its namespace
    (flow,) = [f for f in report["tcp_flows"]["flows"] if f["dport"] == port]
    assert (flow["saddr"], flow["daddr"], flow["closed"]) == (pair.addr_a, pair.addr_b, False)
    assert flow["retrans_segs"] > 0 and flow["bytes_acked"] > 0 and flow["srtt_us"] > 0
    assert flow["pid"] == sender_pid and flow["netns"] == pair.netns_inode(pair.a)
    assert all(port in (f["sport"], f["dport"]) for f in report["tcp_flows"]["flows"])

    # verbs_qp: the QP as NCCL leaves it, with the RoCEv2 source port mlx5 would use
    (qp,) = [q for q in report["verbs_qp"]["qps"] if q["pid"] == driver_pid]
    assert (qp["lqpn"], qp["rqpn"], qp["state"], qp["sport"]) == (LQPN, RQPN, "RTS", SPORT)

    # pfc: the real ioctl read the veth, which has statistics but no pause counters
    (nd,) = report["pfc"]["netdevs"]
    assert (nd["netdev"], nd["counters"]) == (veth, {})
    assert veth not in report["pfc"].get("unavailable", {})

    # kmsg: the appended kernel records became events; the user-facility forgery did not
    xids = [e["attrs"] for e in detail["events"] if e["type"] == "xid"]
    assert {"code": 79, "pci": "0000:3b:00"}.items() <= xids[0].items()
    assert all(x["pci"] != "0000:af:00" for x in xids)
    links = [e for e in detail["events"] if e["type"] == "nic_link"]
    down = [e for e in links if e["attrs"]["state"] == "down"]
    assert len(down) == 1 and down[0]["severity"] == "error"
    assert down[0]["attrs"]["netdev"] == "ens2f0np0"

    # the human view names the flows, the QPs and the events
    assert human.returncode == 0, human.stderr
    text = human.stdout
    assert HOST in text and "mlx5_0/1" in text, text
    assert f"TCP flows: {report['tcp_flows']['tracked']} tracked" in text, text
    assert f"verbs QPs: {len(report['verbs_qp']['qps'])}" in text, text
    assert f"{LQPN:#x}" in text and str(SPORT) in text, text  # the QP's row
    assert "Xid (PCI:0000:3b:00): 79" in text and "Link down" in text, text
