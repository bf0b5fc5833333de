"""Cgroups the lab uses: one cgroup v2 per host holding that host's job processes (an agent's
`tcp_flows` collector filters on it, so each agent sees only its host's connections although
eBPF tracepoints are machine-wide), and CPU-limited groups that starve a straggler.

CPU limits use the cgroup v1 `cpu` controller where the machine mounts one (hybrid hierarchy),
else cgroup v2 `cpu.max`. Every group is named `c4lab.<prefix>` at the top.
"""
from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 10_000  # a short period: a starved rank is slowed evenly, not in 100 ms bursts


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of cgroup mounts."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, rest = pre.split(), post.split()
            if rest and rest[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], rest[0], rest[2] if len(rest) > 2 else ""))
    return out


def v2_root() -> Path | None:
    return next((Path(m) for m, fs, _ in _mounts() if fs == "cgroup2"), None)


def v1_cpu_root() -> Path | None:
    return next((Path(m) for m, fs, opts in _mounts()
                 if fs == "cgroup" and "cpu" in opts.split(",")), None)


def top(prefix: str) -> str:
    return f"c4lab.{prefix}"


def host_group(prefix: str, host: str) -> Path | None:
    """The v2 cgroup of a host's job processes (created); None without cgroup v2."""
    root = v2_root()
    if root is None:
        return None
    path = root / top(prefix) / host
    path.mkdir(parents=True, exist_ok=True)
    return path


def join(group: Path, pid: int) -> None:
    (group / "cgroup.procs").write_text(f"{pid}\n")


def starve(prefix: str, name: str, pids: list[int], percent: float) -> Path:
    """Move `pids` into a group limited to `percent` of one CPU; returns the group."""
    # the kernel's smallest quota is 1 ms: below 10 % the period grows instead
    period = max(PERIOD_US, int(1000 * 100 / percent))
    quota = max(int(period * percent / 100), 1000)
    v1 = v1_cpu_root()
    if v1 is not None:
        group = v1 / top(prefix) / name
        group.mkdir(parents=True, exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        root = v2_root()
        if root is None:
            raise OSError("no cgroup cpu controller (neither v1 `cpu` nor cgroup v2)")
        parent = root / f"{top(prefix)}.cpu"
        parent.mkdir(exist_ok=True)
        (root / "cgroup.subtree_control").write_text("+cpu")
        (parent / "cgroup.subtree_control").write_text("+cpu")
        group = parent / name
        group.mkdir(exist_ok=True)
        (group / "cpu.max").write_text(f"{quota} {period}")
    for pid in pids:
        join(group, pid)
    return group


def release(group: Path, pids: list[int]) -> None:
    """Undo `starve`: back to the hierarchy's root (v1) or the host's group (v2)."""
    home = group.parent.parent
    for pid in pids:
        try:
            join(home, pid)
        except OSError:
            continue  # the process is gone
    try:
        group.rmdir()
    except OSError:
        pass


def remove_all(prefix: str) -> list[str]:
    """Remove every cgroup of lab `prefix` (their processes must be gone); returns the
    groups that could not be removed."""
    left = []
    roots = [r for r in (v2_root(), v1_cpu_root()) if r is not None]
    for root in roots:
        for name in (top(prefix), f"{top(prefix)}.cpu"):
            base = root / name
            if not base.exists():
                continue
            for dirpath, _subdirs, _files in sorted(os.walk(base), key=lambda e: -len(e[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    left.append(dirpath)
    return left
