"""`make demo`: the lab end to end, narrated for a newcomer (scripts/demo.sh runs this).

1. bring up the default lab (8 hosts, 4 leaves, 2 spines; an aggregator, one agent per host);
2. run the ring AllReduce job and print its step time and bus bandwidth;
3. drop packets on the fabric link that carries most of the job's connections and print the
   incident c4 raised: the link it named, its evidence, the time from injection to naming;
4. heal it, freeze (SIGSTOP) one rank and print the hang incident naming its host and rank;
5. tear everything down;
6. C4P, on a 2-host lab of its own whose agents also trace TCP connections (eBPF): two
   connections each way that ECMP's hash puts on one spine, `c4 plan`, `c4 plan apply`, the
   ranks reconnect on the planned ports; step time and spine load before and after;
7. print a table of what was shown.

Exits 1 if any step did not show what it should (wrong or no component named in time).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from . import c4p, control, faults, runs
from .api import incidents, top
from .state import LabState
from .workload import read_steps

PREFIX = "c4demo"


@dataclass
class Row:
    step: str
    expected: str
    shown: str
    seconds: float | None
    ok: bool


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def wait_incident(st: LabState, match: Callable[[dict[str, Any]], bool], since: float,
                  timeout: float) -> dict[str, Any] | None:
    """The first localised incident after `since` that `match`es, or None at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for inc in incidents(st):
            if inc.get("localised") and inc["localised"] >= since and match(inc):
                return inc
        time.sleep(0.5)
    return None


def show_incident(st: LabState, inc: dict[str, Any]) -> None:
    env = dict(os.environ, COLUMNS=os.environ.get("COLUMNS", "120"))
    subprocess.run([sys.executable, "-m", "c4.cli", "incident", str(inc["id"]),
                    "--aggregator", st.api], env=env, check=False)


def run(args: argparse.Namespace) -> int:
    rows: list[Row] = []
    t_start = time.monotonic()
    if Path(f"/run/c4-lab/{PREFIX}/state.json").exists() or control.netns.listed(PREFIX):
        control.down(PREFIX)
    try:
        say("1. the lab: a leaf-spine fabric of network namespaces with real ECMP, tbf-shaped "
            "100 Mbit/s fabric links, c4's aggregator and one agent per host")
        # the agents as `c4 lab up` runs them: eBPF tcp_flows too (retransmits per connection)
        st = control.up(None, PREFIX, control.DEFAULT_COLLECTORS + ("tcp_flows",),
                        say=lambda s: say("   " + s))
        rows.append(Row("lab up", "8 hosts, 4 leaves, 2 spines, 8 agents",
                        f"ready in {st.data['ready_s']:.1f} s", st.data["ready_s"], True))

        say("2. a data-parallel job: each step 20 ms of compute, then 4 MiB of gradients in 4 ring "
            "AllReduces over TCP (2 channels); the c4 NCCL profiler plugin reports every rank's "
            "progress to its host's agent")
        rid = runs.start_ring(st, steps=0, payload=4 << 20, compute_ms=20, channels=2,
                              say=lambda s: say("   " + s))
        _, info = runs.run_info(st, rid)
        d = Path(info["dir"])
        steps = runs.wait_steps(d, args.warmup, 90, info)
        for s in steps[-4:]:
            say(f"   step {s['step']:3d}: {s['step_s']:.3f} s, bus bandwidth "
                f"{s['busbw_mbit']:.1f} Mbit/s")
        med = statistics.median(s["busbw_mbit"] for s in steps)
        step_s = statistics.median(s["step_s"] for s in steps)
        rows.append(Row("ring AllReduce", "steps complete, bus bandwidth reported",
                        f"step {step_s:.2f} s, bus bw {med:.0f} Mbit/s", None, med > 0))

        load = runs.link_load(st, rid)
        link, conns = next(iter(load.items()))
        say(f"3. {args.loss}% packet loss on fabric link {link} ({len(conns)} of the job's "
            f"connections cross it); c4 should name that link")
        f = faults.inject(st, "loss", link, {"percent": args.loss, "direction": "both"})
        inc = wait_incident(st, lambda i: top(i).get("id") == link, f["injected"], args.link_timeout)
        if inc is None:
            others = [f"{i['class']}: {top(i).get('id')}" for i in incidents(st)]
            rows.append(Row("loss on a fabric link", link, f"not named in {args.link_timeout:.0f} s"
                            f" ({'; '.join(others) or 'no incident'})", None, False))
        else:
            took = inc["localised"] - f["injected"]
            # whichever detector named it first (slow matrix, NIC loss counters, ACK timeouts)
            say(f"   incident {inc['id']}: {inc['class']} naming {top(inc)['kind']} "
                f"{top(inc)['id']} (confidence {top(inc)['confidence']:.2f}) {took:.1f} s after "
                f"the injection: {inc['summary']}")
            show_incident(st, inc)
            rows.append(Row("loss on a fabric link", link,
                            f"{inc['class']}: {top(inc)['kind']} {top(inc)['id']}", took, True))
        faults.heal(st, f["id"])
        say("   healed")
        time.sleep(args.settle)

        _, info = runs.run_info(st, rid)
        victim = max(int(r) for r in info["pids"]) // 2 + 1
        host = info["hosts"][str(victim)]
        say(f"4. rank {victim} on {host} freezes (SIGSTOP): the others wait for it in the "
            "AllReduce; c4 should name its host and rank")
        f = faults.inject(st, "hang", str(victim), {})
        inc = wait_incident(st, lambda i: "hang" in i["class"] and top(i).get("host") == host,
                            f["injected"], args.hang_timeout)
        if inc is None:
            others = [f"{i['class']}: {top(i).get('id')}" for i in incidents(st)]
            rows.append(Row("hung rank", f"{host} rank {victim}",
                            f"not named in {args.hang_timeout:.0f} s ({'; '.join(others)})", None,
                            False))
        else:
            took = inc["localised"] - f["injected"]
            say(f"   incident {inc['id']}: {inc['class']} naming {top(inc)['kind']} "
                f"{top(inc)['id']} rank {top(inc).get('rank')} {took:.1f} s after the freeze")
            show_incident(st, inc)
            rows.append(Row("hung rank", f"{host} rank {victim}",
                            f"{inc['class']}: {top(inc)['id']} rank {top(inc).get('rank')}", took,
                            top(inc).get("rank") == victim))
        faults.heal(st, f["id"])
        runs.stop_run(st, rid)
        last = [s for s in read_steps(d) if "step" in s]
        say(f"   healed; the job ran {len(last)} steps")
    finally:
        say("5. tearing down")
        removed = control.down(PREFIX)
        rows.append(Row("lab down", "no namespace or process left",
                        f"{removed['namespaces']} namespaces, {removed['processes']} processes "
                        "removed", None, not control.netns.listed(PREFIX)))
    say("6. C4P: ECMP hashes flows onto spines blindly; two connections each way between two "
        "hosts collide on one spine, and the planner gives them source ports on both")
    try:
        got = c4p.demo(PREFIX + "p", say)
        rows.append(Row("C4P plan applied", "flows spread, step time >= 1.5x faster",
                        f"step {got['before']:.2f} s -> {got['after']:.2f} s "
                        f"({got['speedup']:.1f}x), {got['moved']} flows moved", None, got["ok"]))
    except Exception as exc:  # a step that failed is a row that says so, like the others
        rows.append(Row("C4P plan applied", "flows spread, step time >= 1.5x faster",
                        f"failed: {exc}", None, False))
    total = time.monotonic() - t_start
    print()
    print(f"{'step':24s} {'expected':38s} {'c4 / the lab showed':54s} {'time':>7s}  ok")
    for r in rows:
        t = f"{r.seconds:5.1f} s" if r.seconds is not None else ""
        print(f"{r.step:24s} {r.expected:38s} {r.shown[:54]:54s} {t:>7s}  "
              f"{'yes' if r.ok else 'NO'}")
    ok = all(r.ok for r in rows) and len(rows) == 6
    print(f"\n{'all steps showed what they should' if ok else 'SOME STEPS FAILED'} "
          f"({total:.0f} s)")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m c4.lab.demo", description=__doc__)
    p.add_argument("--loss", type=float, default=5.0, help="percent loss on the fabric link")
    p.add_argument("--warmup", type=int, default=6, help="job steps before the first fault")
    p.add_argument("--link-timeout", type=float, default=45.0)
    p.add_argument("--hang-timeout", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=3.0, help="seconds after healing the loss")
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
