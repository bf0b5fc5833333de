"""Cost of the verbs_qp uprobes: ns per ibv_modify_qp call with and without them attached, and
the agent-side cost of one collect() over many QPs. Needs root (eBPF) and gcc/make (the verbs
test target). Prints numbers; asserts nothing.

    sudo .venv/bin/python bench/verbs_qp_overhead.py [--calls 200000] [--qps 4000]

Each ibv_modify_qp call takes an entry uprobe and a return uprobe (two traps into the
kernel), so expect a few microseconds per call. Applications call it a handful of times per
QP (RESET -> INIT -> RTR -> RTS) when connections are set up, never per message, so the
cost per training job is milliseconds once.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from c4.agent.collectors import Context  # noqa: E402
from c4.agent.collectors.verbs_qp import VerbsQpCollector  # noqa: E402
from tests.verbs import harness  # noqa: E402


def ns_per_modify(driver: harness.Driver, calls: int, repeats: int = 5) -> float:
    """Median over `repeats` runs of the driver's timed RTS -> RTS modify loop."""
    return statistics.median(float(driver.ok(f"loop 0x1fd2 {calls}").split()[1])
                             for _ in range(repeats))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200000, help="modify calls per timed loop")
    ap.add_argument("--qps", type=int, default=4000, help="QPs in the collect() measurement")
    args = ap.parse_args()
    why = harness.missing_toolchain()
    if why:
        sys.exit(f"cannot build the verbs test target: {why}")
    harness.build("all")

    driver = harness.Driver()
    try:
        for cmd in ("create 0x1fd2 RC", "modify 0x1fd2 INIT",
                    "modify 0x1fd2 RTR 0x423c 0 10.0.0.2", "modify 0x1fd2 RTS"):
            driver.ok(cmd)
        base = ns_per_modify(driver, args.calls)
        collector = VerbsQpCollector(Context(host="bench"), {"library": str(harness.LIBRARY),
                                                            "netlink": False,
                                                            "max_report": 10000})
        t0 = time.perf_counter()
        collector.start()
        load_s = time.perf_counter() - t0
        try:
            probed = ns_per_modify(driver, max(1, args.calls // 10))
            for i in range(args.qps):
                driver.ok(f"create {0x10000 + i} RC")
                driver.ok(f"modify {0x10000 + i} INIT")
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                section = collector.collect(time.time()).section
                times.append(time.perf_counter() - t0)
        finally:
            collector.close()
    finally:
        driver.close()

    print(f"ibv_modify_qp without uprobes: {base:10.1f} ns/call")
    print(f"ibv_modify_qp with uprobes:    {probed:10.1f} ns/call "
          f"(+{probed - base:.1f} ns, {probed / base:.0f}x; entry + return probe)")
    print(f"per QP set-up (4 modifies + create + destroy, ~6 probed calls): "
          f"~{6 * (probed - base) / 1000:.1f} us once per connection, nothing per message")
    print(f"BPF compile + load + attach: {load_s:.2f} s")
    print(f"collect() over {len(section['qps'])} QPs: median {statistics.median(times) * 1e3:.1f}"
          f" ms, first {times[0] * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
