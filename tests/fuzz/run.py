"""Coverage-guided fuzzing with atheris (libFuzzer for Python) of tests/fuzz/targets.py.

    python -m tests.fuzz.run                       # every target, 60 s each, summary table
    python -m tests.fuzz.run --seconds 300 wire    # one target, longer
    python -m tests.fuzz.run --seed                # rebuild tests/fuzz/corpus from fixtures
    python -m tests.fuzz.run --seed federation     # only that target's

Each target runs in its own process (libFuzzer owns the process). The kept corpus in
tests/fuzz/corpus/<target>/ is read, never written: inputs found in a run go to a temporary
directory, crashes to `--artifacts` (default: a temporary directory, printed).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .targets import TARGETS

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
REPO = HERE.parents[1]


@dataclass
class Result:
    target: str
    runs: int
    seconds: float
    crashed: bool
    artifacts: list[str]
    tail: str


def fuzz(target: str, seconds: int, artifacts: Path, extra: list[str] = ()) -> Result:
    """Run one target for `seconds` in a child process; parse libFuzzer's summary."""
    with tempfile.TemporaryDirectory(prefix=f"c4-fuzz-{target}-") as work:
        cmd = [sys.executable, "-m", "tests.fuzz.run", "--child", target, "--",
               work, str(CORPUS / target), f"-max_total_time={seconds}",
               f"-artifact_prefix={artifacts}/{target}-", "-print_final_stats=1",
               "-rss_limit_mb=2048", "-timeout=10", *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                           timeout=seconds + 120)
    out = p.stdout + p.stderr
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", out)
    took = re.findall(r"Done (\d+) runs in (\d+) second", out)
    made = re.findall(r"Test unit written to (\S+)", out)
    crashed = p.returncode != 0 or bool(made)
    return Result(target, int(runs[-1]) if runs else (int(took[-1][0]) if took else 0),
                  float(took[-1][1]) if took else float(seconds), crashed, made,
                  "\n".join(out.splitlines()[-40:]))


def _child(target: str, argv: list[str]) -> None:
    import atheris

    from . import targets

    with atheris.instrument_imports(include=["c4"]):
        one = targets.build(target)
    atheris.Setup([sys.argv[0], *argv], one)
    atheris.Fuzz()


def seed(only: list[str]) -> None:
    """The kept corpus, from the golden fixtures (tests/fixtures) and the hostile shapes the
    unit tests use: a starting point the fuzzer mutates, not a list of known bugs. `only`:
    these targets' (default: all)."""
    import msgpack

    from c4.core import record

    from tests import plugin_dgram as dg

    from . import targets

    fixtures = REPO / "tests" / "fixtures"
    frames = list(record.read(fixtures / "wire" / "agent.c4rec"))
    kinds_seen: dict[str, int] = {}
    picked = []
    for f in frames:  # a few of each kind, small ones first
        k = msgpack.unpackb(f).get("kind", "?")
        if kinds_seen.get(k, 0) < 4:
            kinds_seen[k] = kinds_seen.get(k, 0) + 1
            picked.append(f)
    plugin = sorted((fixtures / "plugin").glob("*.bin"))
    dgrams = [p.read_bytes() for p in plugin] + [
        dg.summary([(1, 0, 0, 2**64 - 1)] * 2, colls=1), dg.stalled(3),
        dg.summary([(1, 0, 1, 5)], nparts=2), dg.summary([(1, 0, 1, 5)], nparts=2, part=1)]
    sets = {
        "wire": picked, "ingest": picked,
        "plugin": dgrams,
        "nccl": [targets.join(dgrams[i:i + 3]) for i in range(0, len(dgrams), 2)]
        + [targets.join(dgrams)],
        "federation": _federation_seeds(targets.forwards, targets.frames(), msgpack.packb),
    }
    for target, items in sets.items():
        if only and target not in only:
            continue
        d = CORPUS / target
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
        for i, data in enumerate(items):
            (d / f"seed-{i:03d}").write_bytes(data)
        print(f"{target}: {len(items)} seeds in {d.relative_to(REPO)}")


def _federation_seeds(forwards: Callable[[list[Any]], bytes], frames: list[bytes],
                      pack: Callable[[Any], bytes]) -> list[bytes]:
    """Streams of one peer (tests/fuzz/targets.py `Forwards`): sender b (0) in order, with a
    gap, lost frames (a floor past what was applied), reboots, huge sequence numbers, other
    senders, raw headers and frames, other shapes, each reject."""
    def at(body: int, host: int = 2) -> int:  # frames(): 11 bodies x 4 hosts
        return body * 4 + host

    def nxt(frame: int | bytes, sender: int = 0, boot: int = 0) -> tuple[int, Any, Any]:
        return (0, (sender, boot, 3, 0, 0), frame)  # fseq = applied + 1, floor = fseq

    head = {"from": "b", "boot": "0123456789abcdef", "fseq": 1, "floor": 1}
    in_order = [nxt(at(0)), nxt(at(1)), nxt(at(2, 3)), nxt(at(8)), nxt(at(4)), nxt(at(3))]
    return [forwards(x) for x in (
        in_order,
        [nxt(at(0)), (0, (0, 0, 4, 0, 1), at(1)), nxt(at(1)), nxt(at(2)),
         (0, (0, 0, 1, 0, 0), at(1))],  # a gap, the resend, a duplicate
        [nxt(at(0)), (0x30, (0, 0, 0, 5 << 48, 0), at(1)), nxt(at(2))],  # floor 5: 4 lost
        in_order[:3] + [nxt(at(1), boot=1), nxt(at(2), boot=1), nxt(at(1))],  # reboots
        [(0x10, (0, 0, 0, (1 << 62) - 1, 0), at(1)), nxt(at(2)),
         (0x10, (0, 0, 0, (1 << 64) - 1, 0), at(1)), (0x40, (0, 0, 3, 0, 0), at(1))],
        [nxt(at(1), sender=1), nxt(at(1), sender=2), nxt(at(1), sender=3),
         nxt(at(1), boot=3), (0x80, (0, 0, 3, 0, 0), at(1))],
        [(4, b"\xc1", at(1)), (4, pack(head), at(1)), (4, pack([1, 2]), at(1)),
         (4, pack({**head, "fseq": True}), at(1)), (4, pack({**head, "from": 7}), at(1))],
        [(8, (0, 0, 3, 0, 0), frames[at(1)]), (8, (0, 0, 3, 0, 0), frames[at(8)][:-3]),
         (8, (0, 0, 3, 0, 0), b"\x80"), (1, (0, 0, 3, 0, 0), 0), (2, (0, 0, 3, 0, 0), at(1))],
        [nxt(at(b)) for b in (5, 6, 7, 9, 10, 1)],
    )]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", help=f"of {', '.join(TARGETS)} (default: all)")
    ap.add_argument("--seconds", type=int, default=60, help="per target")
    ap.add_argument("--artifacts", help="directory for crashing inputs")
    ap.add_argument("--seed", action="store_true",
                    help="rebuild the kept corpus (of the targets named, default all) and exit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    own = sys.argv[1:sys.argv.index("--")] if "--" in sys.argv else sys.argv[1:]
    args = ap.parse_args(own)
    if args.child:  # libFuzzer's arguments follow "--"
        _child(args.child, sys.argv[sys.argv.index("--") + 1:])
        return 0
    if args.seed:
        seed(args.targets)
        return 0
    art = Path(args.artifacts or tempfile.mkdtemp(prefix="c4-fuzz-crashes-"))
    art.mkdir(parents=True, exist_ok=True)
    bad = 0
    print(f"{'target':8} {'executions':>12} {'seconds':>8}  result")
    for t in args.targets or TARGETS:
        r = fuzz(t, args.seconds, art)
        bad += r.crashed
        print(f"{t:8} {r.runs:>12,} {r.seconds:>8.0f}  "
              f"{'CRASH ' + ' '.join(r.artifacts) if r.crashed else 'ok, 0 crashes'}",
              flush=True)
        if r.crashed:
            print(r.tail)
    if not args.artifacts and not any(art.iterdir()):
        art.rmdir()  # ours, and nothing crashed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
