"""CPU and memory of the tcp_flows collector at a 1 s interval with 1,000 live TCP connections
on loopback (2,000 sockets: both ends are flows), in two scenarios: every connection
trickles data (every flow changes every interval), and mostly idle (1% of the connections
trickle). Needs root. Prints numbers; asserts nothing.

    sudo .venv/bin/python bench/agent_cpu.py [--connections 1000] [--seconds 30]

The traffic runs in another process (in a network namespace of its own), so the process
CPU time measured here (time.process_time) is the collector's: reading the maps, deltas,
building the section. Target: <= 1% of one core. `--seconds` should cover a
`refresh_intervals` period (default 30) so that the full refresh is in the average. Also
measured apart: encoding each report as the agent's sender does (schema validation and
msgpack, c4.core.wire.encode), a cost that scales with the flows listed too.

About memory: most of the RSS is BCC itself. BCC links LLVM/clang and compiles
bpf/tcp_flows.c at start (~1 s, tens of MiB that stay mapped). A libbpf CO-RE skeleton or a
precompiled BPF object loaded with libbpf would drop the compiler from the agent entirely
(a few MiB of RSS, no start-up compile, no kernel headers on the host).
"""
from __future__ import annotations

import argparse
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from c4.agent.collectors import Context  # noqa: E402
from c4.agent.collectors.tcp_flows import TcpFlowsCollector  # noqa: E402
from c4.core import wire  # noqa: E402

TRICKLE = r"""
import resource, selectors, socket, sys, time
n, active = int(sys.argv[1]), max(1, int(sys.argv[2]))
resource.setrlimit(resource.RLIMIT_NOFILE, (4 * n + 64, 4 * n + 64))
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(n)
clients, servers = [], []
for _ in range(n):
    clients.append(socket.create_connection(ls.getsockname()))
    servers.append(ls.accept()[0])
for c, s in zip(clients, servers):  # one byte each: every server socket learns its owner
    c.send(b"x")
    s.recv(1)
sel = selectors.DefaultSelector()
for s in servers:
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
step = max(1, min(100, active))
while True:  # each active connection sends 100 B per second, spread over the second
    for i, c in enumerate(clients[:active]):
        c.send(b"x" * 100)
        if i % step == step - 1:
            for key, _ in sel.select(0):
                key.fileobj.recv(65536)
            time.sleep(step / active)
"""


def scenario(collector: TcpFlowsCollector, connections: int, active: int,
             seconds: int) -> dict[str, float]:
    """Run `connections` with `active` of them trickling; collect once per second."""
    ns = f"c4tfb-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    traffic = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        traffic = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", TRICKLE,
                                    str(connections), str(active)], stdout=subprocess.PIPE,
                                   text=True)
        assert traffic.stdout is not None and traffic.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        collector.collect(time.time())  # drains what came before (other scenario, set-up)
        wall0 = time.perf_counter()
        costs, listed, refresh, encode = [], [], 0.0, 0.0
        next_t = wall0
        for seq in range(1, seconds + 1):
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.perf_counter()))
            c0 = time.process_time()
            sample = collector.collect(time.time())
            c1 = time.process_time()
            wire.encode(wire.Frame("report", "bench", "boot", seq, time.time(), {
                "interval": 1.0, "health": {}, "tcp_flows": sample.section}))
            encode += time.process_time() - c1
            costs.append(c1 - c0)
            if sample.section.get("refresh"):
                refresh = c1 - c0
            else:
                listed.append(len(sample.section["flows"]))
        wall = time.perf_counter() - wall0
        tracked = sample.section["tracked"]
    finally:
        if traffic is not None:
            traffic.kill()
            traffic.wait()
        subprocess.run(["ip", "netns", "del", ns], check=False)
    return {"cpu_pct": 100 * sum(costs) / wall, "encode_pct": 100 * encode / wall,
            "tracked": tracked, "listed": statistics.median(listed or [0]),
            "min_ms": 1000 * min(costs), "median_ms": 1000 * statistics.median(costs),
            "max_ms": 1000 * max(costs), "refresh_ms": 1000 * refresh}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=30, help="collects per scenario")
    ap.add_argument("--idle-active", type=int, default=10,
                    help="connections that trickle in the mostly idle scenario")
    ap.add_argument("--refresh-intervals", type=int, default=30)
    args = ap.parse_args()
    me = psutil.Process()
    rss0 = me.memory_info().rss
    collector = TcpFlowsCollector(Context(host="bench"),
                                  {"refresh_intervals": args.refresh_intervals})
    t0 = time.perf_counter()
    collector.start()
    start_s = time.perf_counter() - t0
    rss_loaded = me.memory_info().rss
    results = {}
    try:
        for label, active in (("all flows active", args.connections),
                              ("mostly idle", args.idle_active)):
            results[label] = scenario(collector, args.connections, active, args.seconds)
        rss = me.memory_info().rss
    finally:
        collector.close()
    print(f"tcp_flows collector, {args.connections} connections (both ends on this host), "
          f"1 s interval, {args.seconds} collects per scenario, refresh every "
          f"{args.refresh_intervals} intervals")
    for label, r in results.items():
        print(f"  {label:17s} CPU {r['cpu_pct']:5.2f}% of one core (target <= 1%); "
              f"{r['tracked']} flows tracked, {r['listed']:.0f} listed per report (median, "
              f"refresh aside); collect() "
              f"{r['min_ms']:.1f}/{r['median_ms']:.1f}/{r['max_ms']:.1f} ms CPU "
              f"min/median/max (refresh {r['refresh_ms']:.1f} ms); encoding the report "
              f"{r['encode_pct']:.2f}%")
    print(f"  start (compile + load): {start_s:.2f} s")
    print(f"  RSS: {rss0 / 2**20:.0f} MiB before start, {rss_loaded / 2**20:.0f} MiB after "
          f"loading, {rss / 2**20:.0f} MiB steady")
    print("  note: BCC keeps LLVM/clang mapped; a libbpf CO-RE skeleton or a precompiled "
          "object would remove the compiler from the agent")


if __name__ == "__main__":
    main()
