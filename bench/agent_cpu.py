"""CPU and memory of the tcp_flows collector at a 1 s interval with 1,000 live TCP connections
on loopback that trickle data (2,000 sockets: both ends are flows). Needs root. Prints
numbers; asserts nothing.

    sudo .venv/bin/python bench/agent_cpu.py [--connections 1000] [--seconds 10]

The traffic runs in another process (in a network namespace of its own), so the process
CPU time measured here (time.process_time) is the collector's: reading the maps, deltas,
top-N, building the section. Target: <= 1% of one core.

About memory: most of the RSS is BCC itself. BCC links LLVM/clang and compiles
bpf/tcp_flows.c at start (~1 s, tens of MiB that stay mapped). A libbpf CO-RE skeleton or a
precompiled BPF object loaded with libbpf would drop the compiler from the agent entirely
(a few MiB of RSS, no start-up compile, no kernel headers on the host).
"""
from __future__ import annotations

import argparse
import secrets
import subprocess
import sys
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.collectors import Context  # noqa: E402
from agent.collectors.tcp_flows import TcpFlowsCollector  # noqa: E402

TRICKLE = r"""
import resource, selectors, socket, sys, time
n = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_NOFILE, (4 * n + 64, 4 * n + 64))
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(n)
clients, servers = [], []
for _ in range(n):
    clients.append(socket.create_connection(ls.getsockname()))
    servers.append(ls.accept()[0])
sel = selectors.DefaultSelector()
for s in servers:
    s.setblocking(False)
    sel.register(s, selectors.EVENT_READ)
print("ready", flush=True)
while True:  # every connection sends 100 B per second, spread over the second
    for i, c in enumerate(clients):
        c.send(b"x" * 100)
        if i % 100 == 99:
            for key, _ in sel.select(0):
                key.fileobj.recv(65536)
            time.sleep(1.0 / (n / 100))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=10)
    args = ap.parse_args()
    me = psutil.Process()
    rss0 = me.memory_info().rss
    collector = TcpFlowsCollector(Context(host="bench"), {})
    t0 = time.perf_counter()
    collector.start()
    start_s = time.perf_counter() - t0
    rss_loaded = me.memory_info().rss
    ns = f"c4tfb-{secrets.token_hex(3)}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    traffic = None
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        traffic = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", TRICKLE,
                                    str(args.connections)], stdout=subprocess.PIPE, text=True)
        assert traffic.stdout is not None and traffic.stdout.readline().strip() == "ready"
        collector.collect(time.time())  # the first report carries every flow once
        cpu0, wall0 = time.process_time(), time.perf_counter()
        costs, flows = [], 0
        next_t = wall0
        for _ in range(args.seconds):
            next_t += 1.0
            time.sleep(max(0.0, next_t - time.perf_counter()))
            c0 = time.process_time()
            sample = collector.collect(time.time())
            costs.append(time.process_time() - c0)
            flows = len(sample.section["flows"])
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        rss = me.memory_info().rss
    finally:
        if traffic is not None:
            traffic.kill()
            traffic.wait()
        collector.close()
        subprocess.run(["ip", "netns", "del", ns], check=False)
    print(f"tcp_flows collector, {args.connections} connections ({flows} flows per report), "
          f"1 s interval, {args.seconds} s")
    print(f"  CPU: {100 * cpu / wall:.2f}% of one core (target <= 1%); collect() "
          f"{1000 * min(costs):.1f}-{1000 * max(costs):.1f} ms CPU each")
    print(f"  start (compile + load): {start_s:.2f} s")
    print(f"  RSS: {rss0 / 2**20:.0f} MiB before start, {rss_loaded / 2**20:.0f} MiB after "
          f"loading, {rss / 2**20:.0f} MiB steady")
    print("  note: BCC keeps LLVM/clang mapped; a libbpf CO-RE skeleton or a precompiled "
          "object would remove the compiler from the agent")


if __name__ == "__main__":
    main()
