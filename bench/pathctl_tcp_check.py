"""What a TCP plan in flight costs the agent: the agent's loop asks PathControl.results() every
20 ms (agent/planning.py BUSY_POLL) until the plan's deadline, and the connection table
(/proc/net/tcp, every connection in the namespace) is read to see whether the planned port is
live. Runs on a synthetic /proc with `--connections` ESTABLISHED lines; no root, no network.
Prints, per plan: reads of the table, CPU seconds of the whole process, and the time the loop
thread spent inside results(). Asserts nothing.

    .venv/bin/python bench/pathctl_tcp_check.py [--connections 10000] [--deadline 2]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from c4.agent import pathctl  # noqa: E402
from c4.agent.tcp_ports import established  # noqa: E402

BUSY_POLL = 0.02


def fake_proc(root: Path, n: int) -> None:
    (root / "net").mkdir(parents=True)
    head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
    lines = [f"{i:4d}: 0100007F:{1024 + i % 60000:04X} 0200000A:{20000 + i % 1000:04X} 01 "
             "00000000:00000000 00:00000000 00000000     0        0 1 1 0000 100 0 0 10 0\n"
             for i in range(n)]
    (root / "net" / "tcp").write_text(head + "".join(lines))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--connections", type=int, default=10000)
    ap.add_argument("--deadline", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc = Path(tmp) / "proc"
        fake_proc(proc, args.connections)
        t0 = time.perf_counter()
        for _ in range(20):
            established(proc)
        per_read = (time.perf_counter() - t0) / 20
        reads = 0
        real = pathctl.established

        def counted(root: Path) -> list[tuple[int, str, int]]:
            nonlocal reads
            reads += 1
            return real(root)

        pathctl.established = counted  # type: ignore[assignment]
        pc = pathctl.PathControl(Path(tmp) / "run", deadline=args.deadline, proc_root=proc)
        pc.start()
        try:
            cpu0 = time.process_time()
            pc.submit({"plan_id": "p", "assignments": [
                {"id": "t", "proto": "tcp", "sport": 42001, "dst": "192.0.2.1", "dport": 9}]})
            in_results = 0.0
            while True:
                t = time.perf_counter()
                out = pc.results()
                in_results += time.perf_counter() - t
                if out:
                    break
                time.sleep(BUSY_POLL)
            cpu = time.process_time() - cpu0
        finally:
            pc.close()
    print(f"{args.connections} connections: one read of the table {per_read * 1e3:.1f} ms; "
          f"a {args.deadline:g} s TCP plan: {reads} reads, {cpu:.3f} s CPU, "
          f"loop thread inside results() {in_results * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
