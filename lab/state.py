"""The lab's state directory: what `up` made, so that `down`, `inject` and `run` find it.

    /run/c4-lab/<prefix>/
      state.json        phase, namespaces, pids, API URL (rewritten atomically as up goes)
      topology.json     the topology with the lab's path map (the aggregator reads it)
      aggregator.toml, c4.db, logs/
      hosts/<host>/     agent.toml, sys/ (RDMA sysfs tree), run/ (plugin socket)
      faults.jsonl      ground truth: one line per injection and per heal
      runs/<id>/        workloads

Every process the lab starts carries `C4_LAB=<prefix>` in its environment, and every
namespace and cgroup its name prefix, so `down` finds what a killed `up` left even when
state.json is incomplete.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from c4.core.topology import Topology

from .fabric import Fabric

ROOT = Path(os.environ.get("C4_LAB_ROOT", "/run/c4-lab"))
ENV_MARK = "C4_LAB"
DEFAULT_PREFIX = "c4lab"


class LabError(RuntimeError):
    """A lab operation cannot proceed; the message says what to do."""


def check_prefix(prefix: str) -> str:
    if not (1 <= len(prefix) <= 12 and prefix.replace("_", "").isalnum()
            and prefix[0].isalpha()):
        raise LabError(f"prefix {prefix!r}: 1-12 letters, digits or '_', starting with a letter")
    return prefix


@dataclass
class LabState:
    dir: Path
    data: dict[str, Any]

    @classmethod
    def path_for(cls, prefix: str) -> Path:
        return ROOT / check_prefix(prefix)

    @classmethod
    def open(cls, prefix: str) -> "LabState":
        d = cls.path_for(prefix)
        if not (d / "state.json").exists():
            raise LabError(f"no lab {prefix!r} is up (no {d}/state.json); "
                           f"start one with `c4 lab up --prefix {prefix}`")
        return cls.open_dir(d)

    @classmethod
    def open_dir(cls, d: Path) -> "LabState":
        return cls(d, json.loads((d / "state.json").read_text()))

    @property
    def prefix(self) -> str:
        return str(self.data["prefix"])

    def save(self) -> None:
        tmp = self.dir / ".state.json.tmp"
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        os.replace(tmp, self.dir / "state.json")

    @contextmanager
    def locked(self) -> Iterator["LabState"]:
        """Serialises commands that change the lab (inject, heal, run); reloads the state."""
        with open(self.dir / ".lock", "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            try:
                self.data = json.loads((self.dir / "state.json").read_text())
                yield self
                self.save()
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    # -- what it holds ---------------------------------------------------------------------
    def topology(self) -> Topology:
        return Topology.load(self.dir / "topology.json")

    def fabric(self) -> Fabric:
        return Fabric(self.topology(), self.prefix)

    def host_dir(self, host: str) -> Path:
        return self.dir / "hosts" / host

    @property
    def api(self) -> str:
        return str(self.data.get("api", ""))

    def faults_log(self) -> Path:
        return self.dir / "faults.jsonl"

    def log_fault(self, entry: dict[str, Any]) -> None:
        with open(self.faults_log(), "a") as f:
            f.write(json.dumps({**entry, "logged": time.time()}, sort_keys=True) + "\n")


def lab_env(prefix: str) -> dict[str, str]:
    """The environment of every process the lab starts: the marker `down` looks for, and
    the repository on the path (a checkout run without installing)."""
    env = dict(os.environ)
    env[ENV_MARK] = prefix
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("C4_AGGREGATOR", None)
    return env


def marked_pids(prefix: str) -> list[int]:
    """Processes whose environment carries C4_LAB=<prefix>."""
    want = f"{ENV_MARK}={prefix}".encode()
    out = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if want in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out
