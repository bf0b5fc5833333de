"""`c4 lab`: a routed leaf-spine fabric in network namespaces on this machine, with an
aggregator, one agent per host, collective workloads and injected faults (docs/lab.md)."""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from c4.cli.commands._http import print_json as _print
from c4.core.topology import TopologyError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "lab", help="emulate a GPU cluster's fabric on this machine (root)",
        description="Build a leaf-spine fabric of network namespaces (real Linux ECMP, TCP, "
        "eBPF), run c4 on it, run collective jobs and inject faults. Needs root. See "
        "docs/lab.md.")
    lab = p.add_subparsers(dest="lab_command", metavar="ACTION")
    lab.required = True

    def prefix_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("--prefix", default="c4lab",
                       help="name prefix of the lab's namespaces, cgroups and state (default "
                       "c4lab); labs with different prefixes coexist")

    q = lab.add_parser("up", help="build the fabric and start the aggregator and agents",
                       description="Build the fabric from a topology file, start one "
                       "aggregator and one agent per host (in the host's namespace), and the "
                       "pump that advances each host's RDMA sysfs counters from its traffic.")
    q.add_argument("--topology", metavar="FILE",
                   help="topology JSON (c4/core/topology.py) or a shipped name: default (8 "
                   "hosts, 4 leaves, 2 spines), hosts16, rails2, leaves2")
    prefix_arg(q)
    q.add_argument("--ebpf", action=argparse.BooleanOptionalAction, default=True,
                   help="run the agents' eBPF tcp_flows collector (default; needed for jobs "
                   "without the plugin, such as `c4 lab gloo`, and to name a flapping link; "
                   "--no-ebpf saves the ~3 s and the CPU of compiling it)")
    q.add_argument("--interval", type=float, default=1.0, help="agent report interval (s)")
    q.add_argument("--json", action="store_true", help="print the lab's state as JSON")
    q.set_defaults(func=_up)

    q = lab.add_parser("down", help="remove the lab: processes, namespaces, cgroups, state",
                       description="Remove everything lab PREFIX made, also after a crashed "
                       "or killed `c4 lab up` (found by name prefix and process marker).")
    prefix_arg(q)
    q.add_argument("--json", action="store_true", help="print what was removed as JSON")
    q.set_defaults(func=_down)

    q = lab.add_parser("status", help="labs on this machine: processes, faults, runs",
                       description="Show each lab (or one): phase, processes alive, the "
                       "aggregator's URL, active faults, workloads, open incidents.")
    q.add_argument("--prefix", help="only this lab")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=_status)

    q = lab.add_parser("run", help="run the ring AllReduce workload (plugin -> agents)",
                       description="A data-parallel job: per step, compute then a ring "
                       "AllReduce over TCP between ranks in the host namespaces; its collective "
                       "progress reaches the agents through the c4 NCCL profiler plugin. Prints "
                       "step time and bus bandwidth.")
    prefix_arg(q)
    q.add_argument("--steps", type=int, default=20, help="training steps (0: until `c4 lab "
                   "stop`; default 20)")
    q.add_argument("--payload", type=_size, default=4 << 20, metavar="BYTES",
                   help="AllReduce size per step, e.g. 4M (default 4 MiB)")
    q.add_argument("--buckets", type=int, default=4,
                   help="AllReduces the payload is split into per step, like DDP's gradient "
                   "buckets (default 4)")
    q.add_argument("--compute-ms", type=float, default=20.0,
                   help="CPU work per step before the AllReduce, ms of CPU time (default 20)")
    q.add_argument("--channels", type=int, default=2,
                   help="rings (channels), each its own TCP connection per hop (default 2)")
    q.add_argument("--ranks-per-host", type=int, default=1,
                   help="ranks per host, one per NIC rail (default 1)")
    q.add_argument("--hosts", help="comma-separated hosts (default: all)")
    q.add_argument("--job", help="job id the ranks carry (C4_JOB_ID; default lab-<run>)")
    q.add_argument("--detach", action="store_true",
                   help="return once the ranks are connected and stepping; stop with "
                   "`c4 lab stop`")
    q.add_argument("--json", action="store_true", help="print the run (and its steps) as JSON")
    q.set_defaults(func=_run)

    q = lab.add_parser("gloo", help="run a PyTorch DDP job (gloo backend, no plugin)",
                       description="Train a small MLP with PyTorch DistributedDataParallel over "
                       "gloo across the lab's hosts, one rank per host, without the c4 plugin: "
                       "c4 sees it through eBPF flows only (not with `lab up --no-ebpf`). Needs "
                       "the `lab` extra (torch).")
    prefix_arg(q)
    q.add_argument("--steps", type=int, default=20, help="training steps (0: until stopped)")
    q.add_argument("--width", type=int, default=512,
                   help="hidden width of the MLP (gradients: about 2 x width^2 floats)")
    q.add_argument("--batch", type=int, default=32, help="batch size per rank")
    q.add_argument("--hosts", help="comma-separated hosts (default: all)")
    q.add_argument("--job", help="job id the ranks carry (C4_JOB_ID)")
    q.add_argument("--detach", action="store_true", help="return once the job steps")
    q.add_argument("--json", action="store_true", help="print the run as JSON")
    q.set_defaults(func=_gloo)

    q = lab.add_parser("stop", help="stop a running workload",
                       description="Stop workload RUN (default: every running one).")
    prefix_arg(q)
    q.add_argument("run", nargs="?", metavar="RUN", help="run id (see `c4 lab status`)")
    q.set_defaults(func=_stop)

    q = lab.add_parser("reconnect", help="make a running ring job reconnect at a step boundary",
                       description="Ask ring job RUN to re-establish its connections at its "
                       "next step boundary, optionally with new source ports (planned paths). "
                       "Prints the connections' 5-tuples afterwards.")
    prefix_arg(q)
    q.add_argument("run", nargs="?", metavar="RUN", help="run id (default: the latest running)")
    q.add_argument("--sport", action="append", default=[], metavar="CONN=PORT",
                   help="source port for connection CONN (r<rank>c<channel>), repeatable")
    q.add_argument("--json", action="store_true", help="print the connections as JSON")
    q.set_defaults(func=_reconnect)

    q = lab.add_parser("inject", help="inject a fault: loss, slow, down, flap, nicdown, hang, "
                       "straggler", description="Inject a real fault and log it (with the "
                       "component C4D should name) as ground truth. Link faults take a topology "
                       "link id (leaf01-spine00, node003/mlx5_0-leaf01); nicdown a host or "
                       "host/dev; hang and straggler a rank number or a host of the running "
                       "workload. Parameters: loss percent=5 direction=both|ab|ba; slow mbit=10; "
                       "down converge_s=3; flap down_s=1 up_s=3 converge_s=3; straggler cpu=2 "
                       "(% of one CPU).")
    prefix_arg(q)
    q.add_argument("kind", metavar="KIND",
                   help="loss, slow, down, flap, nicdown, hang or straggler")
    q.add_argument("target", metavar="TARGET", help="link id, host[/dev], rank or host")
    q.add_argument("params", nargs="*", metavar="KEY=VALUE", help="fault parameters")
    q.add_argument("--run", help="the workload a hang/straggler targets (default: latest running)")
    q.add_argument("--json", action="store_true", help="print the fault record as JSON")
    q.set_defaults(func=_inject)

    q = lab.add_parser("heal", help="undo a fault (default: every active one)",
                       description="Undo fault ID (default: all active faults) and log the "
                       "time.")
    prefix_arg(q)
    q.add_argument("id", nargs="?", type=int, metavar="ID", help="fault id")
    q.add_argument("--json", action="store_true", help="print the healed faults as JSON")
    q.set_defaults(func=_heal)

    q = lab.add_parser("faults", help="the ground-truth fault log",
                       description="Every fault injected in this lab: kind, target, parameters, "
                       "the component C4D should name, injection and heal times (wall clock).")
    prefix_arg(q)
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=_faults)


def _size(text: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4M, 512k)") from None


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from c4.lab.fabric import FabricError
        from c4.lab.state import LabError

        try:
            return fn(args)
        except (LabError, FabricError, TopologyError) as exc:
            print(f"c4 lab {args.lab_command}: {exc}", file=sys.stderr)
            return 2
        except PermissionError as exc:
            print(f"c4 lab {args.lab_command}: {exc} (the lab needs root)", file=sys.stderr)
            return 2
    return run


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    return lambda s: print(s, file=stream, flush=True)


@_guard
def _up(args: argparse.Namespace) -> int:
    from c4.lab import control

    collectors = control.DEFAULT_COLLECTORS + (("tcp_flows",) if args.ebpf else ())
    st = control.up(args.topology, args.prefix, collectors, args.interval, say=_say(args))
    if args.json:
        _print(control.status(st.prefix)[0])
    else:
        print(f"lab {st.prefix} up in {st.data['ready_s']} s: aggregator {st.api}\n"
              f"  try: c4 hosts --aggregator {st.api}   |   c4 lab run --prefix {st.prefix}")
    return 0


@_guard
def _down(args: argparse.Namespace) -> int:
    from c4.lab import control

    removed = control.down(args.prefix, say=_say(args))
    if args.json:
        _print(removed)
    return 0


@_guard
def _status(args: argparse.Namespace) -> int:
    from c4.lab import control

    labs = control.status(args.prefix)
    if args.json:
        _print({"labs": labs})
        return 0
    if not labs:
        print("no lab is up")
    for lab in labs:
        print(f"{lab['prefix']}: {lab['phase']}, {lab['namespaces']} namespaces, agents "
              f"{lab['agents_alive']}/{lab['agents']}, aggregator "
              f"{'up' if lab['aggregator_alive'] else 'DOWN'} at {lab['api']}, "
              f"open incidents {lab['incidents_open']}")
        for f in lab["faults_active"]:
            print(f"  fault {f['id']}: {f['kind']} {f['target']} since {f['injected']:.0f}")
        for rid, r in lab["runs"].items():
            print(f"  run {rid}: {r.get('kind')} {r.get('state')}")
    return 0


def _step_line(s: dict[str, Any]) -> str:
    return (f"step {s['step']:4d}  step {s['step_s']:7.3f} s  allreduce {s['allreduce_s']:7.3f} s  "
            f"bus bw {s['busbw_mbit']:7.1f} Mbit/s" + ("  (reconnected)" if s.get("reconnected")
                                                      else ""))


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    import statistics

    done = [s for s in steps if "step" in s]
    if not done:
        return {"steps": 0}
    return {"steps": len(done),
            "step_s_median": statistics.median(s["step_s"] for s in done),
            "allreduce_s_median": statistics.median(s["allreduce_s"] for s in done),
            "busbw_mbit_median": statistics.median(s["busbw_mbit"] for s in done)}


@_guard
def _run(args: argparse.Namespace) -> int:
    from c4.lab import runs
    from c4.lab.state import LabState

    st = LabState.open(args.prefix)
    rid = runs.start_ring(st, steps=args.steps, payload=args.payload, compute_ms=args.compute_ms,
                          channels=args.channels, buckets=args.buckets,
                          ranks_per_host=args.ranks_per_host,
                          hosts=args.hosts.split(",") if args.hosts else None, job=args.job,
                          say=_say(args))
    return _follow(args, st, rid)


@_guard
def _gloo(args: argparse.Namespace) -> int:
    from c4.lab import runs
    from c4.lab.state import LabState

    st = LabState.open(args.prefix)
    rid = runs.start_gloo(st, steps=args.steps, width=args.width, batch=args.batch,
                          hosts=args.hosts.split(",") if args.hosts else None, job=args.job,
                          say=_say(args))
    return _follow(args, st, rid)


def _follow(args: argparse.Namespace, st: Any, rid: str) -> int:
    """Print the run's steps until it ends (or return at once with --detach)."""
    import time
    from pathlib import Path

    from c4.lab import runs
    from c4.lab.state import LabError
    from c4.lab.workload import read_steps

    _, info = runs.run_info(st, rid)
    d = Path(info["dir"])
    if args.detach:
        runs.wait_steps(d, 1, 180, info)  # torch takes a while to import on 2 cores
        out = {"run": rid, "dir": str(d), **info}
        if args.json:
            _print(out)
        else:
            print(f"run {rid} stepping in the background ({d}); stop: c4 lab stop --prefix "
                  f"{st.prefix} {rid}")
        return 0
    shown = 0
    try:
        while True:
            steps = read_steps(d)
            for s in steps[shown:]:
                if "step" in s and not args.json:
                    print(_step_line(s), flush=True)
            shown = len(steps)
            if any("done" in s for s in steps):
                break
            if not runs.alive_ranks(info):
                raise LabError(f"the ranks exited early (see {d}/rank*.log)")
            time.sleep(0.2)
    except KeyboardInterrupt:
        runs.stop_run(st, rid)
        return 130
    runs.finish(st, rid)
    summary = summarize(steps)  # the last read holds every step and the "done" line
    if args.json:
        _print({"run": rid, "summary": summary, "steps": steps})
    else:
        print(f"{summary['steps']} steps: median step {summary['step_s_median']:.3f} s, "
              f"AllReduce {summary['allreduce_s_median']:.3f} s, bus bandwidth "
              f"{summary['busbw_mbit_median']:.1f} Mbit/s")
    return 0


@_guard
def _stop(args: argparse.Namespace) -> int:
    from c4.lab import runs
    from c4.lab.state import LabState

    stopped = runs.stop_run(LabState.open(args.prefix), args.run)
    print(f"stopped {', '.join(stopped) or 'nothing'}")
    return 0


@_guard
def _reconnect(args: argparse.Namespace) -> int:
    from pathlib import Path

    from c4.lab import c4p, runs
    from c4.lab.state import LabError, LabState
    from c4.lab.workload import connections, request_reconnect

    st = LabState.open(args.prefix)
    rid, info = runs.run_info(st, args.run)
    sports = {}
    for item in args.sport:
        conn, _, port = item.partition("=")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise LabError(f"--sport {item!r}: expected CONN=PORT, e.g. r0c1=45001")
        sports[conn] = int(port)
    epoch = request_reconnect(info["dir"], sports)
    c4p.wait_epoch(Path(info["dir"]), epoch - 1, 60)
    conns = connections(info["dir"])
    if args.json:
        _print({"run": rid, "epoch": epoch, "connections": conns})
    else:
        for c in conns:
            print(f"{c['id']:8s} {c['saddr']}:{c['sport']} -> {c['daddr']}:{c['dport']}")
    return 0


@_guard
def _inject(args: argparse.Namespace) -> int:
    from c4.lab import faults
    from c4.lab.state import LabState

    st = LabState.open(args.prefix)
    f = faults.inject(st, args.kind, args.target, faults.parse_params(args.kind, args.params),
                      args.run)
    if args.json:
        _print(f)
    else:
        print(f"fault {f['id']}: {f['kind']} on {f['target']} {f['params'] or ''} "
              f"(C4D should name {f['expect']['kind']} {f['expect']['id']}); heal: c4 lab heal "
              f"--prefix {st.prefix} {f['id']}")
    return 0


@_guard
def _heal(args: argparse.Namespace) -> int:
    from c4.lab import faults
    from c4.lab.state import LabState

    healed = faults.heal(LabState.open(args.prefix), args.id)
    if args.json:
        _print(healed)
    else:
        print(f"healed {', '.join(str(f['id']) for f in healed) or 'nothing'}")
    return 0


@_guard
def _faults(args: argparse.Namespace) -> int:
    import time

    from c4.lab import faults
    from c4.lab.state import LabState

    log = faults.faults(LabState.open(args.prefix))
    if args.json:
        _print({"faults": log})
        return 0
    for f in log:
        when = time.strftime("%H:%M:%S", time.localtime(f["injected"]))
        healed = (time.strftime("%H:%M:%S", time.localtime(f["healed"])) if f["healed"]
                  else "active")
        print(f"{f['id']:3d} {f['kind']:9s} {f['target']:24s} {when} -> {healed}  expect "
              f"{f['expect']['kind']} {f['expect']['id']}")
    return 0
