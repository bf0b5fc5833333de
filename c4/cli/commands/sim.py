"""`c4 sim`: generate a recording of a simulated cluster with injected faults (lab/sim.py)."""
from __future__ import annotations

import argparse
import json
import sys

from c4.lab.sim import FAULT_KINDS, TRANSPORTS, Fault, SimConfig, SimError, simulate
from c4.core.topology import TopologyError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    kinds = "; ".join(f"{k}: {t}" for k, (_, t) in FAULT_KINDS.items())
    p = sub.add_parser(
        "sim", help="simulate a training cluster and write a recording to replay",
        description="Simulate GPU hosts on a leaf-spine fabric running NCCL-like jobs and write "
        "what their agents would send (a recording for `c4 replay`), plus OUT.truth.json (the "
        "injected faults and what C4D should name) and OUT.topology.json. Deterministic for a "
        "seed. See docs/diagnosis.md.")
    g = p.add_argument_group("cluster")
    g.add_argument("--hosts", type=int, default=4, help="GPU hosts (default 4)")
    g.add_argument("--gpus-per-host", type=int, default=4, help="GPUs = NICs = ranks per host")
    g.add_argument("--leaves", type=int, default=4, help="leaf switches (hosts in blocks)")
    g.add_argument("--spines", type=int, default=2, help="spine switches")
    g = p.add_argument_group("job")
    g.add_argument("--jobs", type=int, default=1, help="jobs, splitting the hosts in blocks")
    g.add_argument("--share-hosts", action="store_true",
                   help="every job on every host, each on its own GPUs and their NICs")
    g.add_argument("--collective", default="ring",
                   help="ring or tree, or one per job in turn: ring,tree")
    g.add_argument("--transport", choices=TRANSPORTS, default="nccl",
                   help="nccl: NCCL jobs with the c4 plugin; tcp: gloo-like jobs seen only "
                   "through eBPF tcp_flows (one process per host; slow faults, and hang/sigstop: "
                   "a stopped process)")
    g.add_argument("--channels", type=int, default=0, help="channels (0: one per GPU)")
    g.add_argument("--step-time", type=float, default=1.0, help="training step in seconds")
    g.add_argument("--ops-per-step", type=int, default=4, help="collectives per step")
    g.add_argument("--noise", type=float, default=0.05,
                   help="relative noise of network time and compute arrival (lognormal sigma)")
    g.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    g.add_argument("--interval", type=float, default=1.0, help="agent report interval (s)")
    g = p.add_argument_group("faults and realism")
    g.add_argument("--fault", action="append", default=[], metavar="KIND:TARGET@START[-END]",
                   help=f"inject a fault (repeatable). Kinds and targets: {kinds}. RANK is a "
                   "global GPU index: host index * gpus-per-host + gpu")
    g.add_argument("--slowdown", type=float, default=3.0,
                   help="network time per byte multiplier of slow/lossy faults (default 3)")
    g.add_argument("--straggler-delay", type=float, default=0.2,
                   help="seconds a straggler arrives late at each collective")
    g.add_argument("--restart-at", type=float, action="append", default=[], metavar="T",
                   help="restart every job at time T (repeatable): ranks exit, a new "
                   "communicator forms after a downtime, some ranks join late")
    g.add_argument("--no-realism", dest="realism", action="store_false",
                   help="no late joins, one-off slow steps or transient blips")
    g.add_argument("--max-skew", type=float, default=5.0,
                   help="host clocks are offset by up to this many seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="FILE", help="recording to write")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = SimConfig(
            hosts=args.hosts, gpus_per_host=args.gpus_per_host, leaves=args.leaves,
            spines=args.spines, jobs=args.jobs, share_hosts=args.share_hosts,
            collective=args.collective,
            transport=args.transport,
            channels=args.channels, step_time=args.step_time, ops_per_step=args.ops_per_step,
            noise=args.noise, duration=args.duration, interval=args.interval,
            faults=[Fault.parse(f) for f in args.fault], seed=args.seed,
            max_skew=args.max_skew, slowdown=args.slowdown,
            straggler_delay=args.straggler_delay, realism=args.realism,
            restart_at=list(args.restart_at))
        summary = simulate(cfg, args.out)
    except (SimError, TopologyError) as exc:
        print(f"c4 sim: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"c4 sim: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(json.dumps({**summary, "out": args.out, "truth": f"{args.out}.truth.json",
                      "topology": f"{args.out}.topology.json"}))
    return 0
