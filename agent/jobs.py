"""Which job a process belongs to, from its environment (`<proc_root>/<pid>/environ`).

Schedulers export the job id to every task: Slurm `SLURM_JOB_ID`, PBS `PBS_JOBID`, LSF
`LSB_JOBID`, Flux `FLUX_JOB_ID`; torchrun `TORCHELASTIC_RUN_ID`. `C4_JOB_ID` comes first so
an operator can name jobs explicitly (e.g. in a Kubernetes pod spec). Results are cached per
(pid, process start time), so a recycled pid is read again.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Sequence

DEFAULT_KEYS = ("C4_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
                "TORCHELASTIC_RUN_ID")
MAX_JOB_LEN = 128
MAX_ENVIRON = 1 << 20  # the kernel's limit on the environment is larger; ids sit early


class JobResolver:
    def __init__(self, proc_root: Path, keys: Sequence[str] = DEFAULT_KEYS,
                 max_cached: int = 4096) -> None:
        self.proc_root = proc_root
        self.keys = tuple(keys)
        self.max_cached = max_cached
        self._cache: OrderedDict[int, tuple[str, str | None]] = OrderedDict()

    def job_of(self, pid: int) -> str | None:
        """The job id of `pid`, or None (no such process, unreadable, no known variable)."""
        start = self._start_time(pid)
        if start is None:
            self._cache.pop(pid, None)
            return None
        hit = self._cache.get(pid)
        if hit is not None and hit[0] == start:
            self._cache.move_to_end(pid)
            return hit[1]
        job = self._read(pid)
        self._cache[pid] = (start, job)
        self._cache.move_to_end(pid)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return job

    def _start_time(self, pid: int) -> str | None:
        try:
            stat = (self.proc_root / str(pid) / "stat").read_bytes()
        except OSError:
            return None
        fields = stat.rpartition(b")")[2].split()  # the command name may contain spaces
        return fields[19].decode() if len(fields) > 19 else None  # field 22: starttime

    def _read(self, pid: int) -> str | None:
        try:
            with open(self.proc_root / str(pid) / "environ", "rb") as f:
                raw = f.read(MAX_ENVIRON)
        except OSError:
            return None
        env: dict[str, str] = {}
        for item in raw.split(b"\0"):
            name, sep, value = item.partition(b"=")
            if sep:
                env[name.decode("ascii", "replace")] = value.decode("utf-8", "replace")
        for key in self.keys:
            value = env.get(key, "").strip()
            if 0 < len(value) <= MAX_JOB_LEN and value.isprintable():
                return value
        return None
