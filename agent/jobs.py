"""Which job a process belongs to, from its environment (`<proc_root>/<pid>/environ`).

Schedulers export the job id to every task: Slurm `SLURM_JOB_ID`, PBS `PBS_JOBID`, LSF
`LSB_JOBID`, Flux `FLUX_JOB_ID`; torchrun `TORCHELASTIC_RUN_ID`. `C4_JOB_ID` comes first so
an operator can name jobs explicitly (e.g. in a Kubernetes pod spec). Results are cached per
(pid, process start time), so a recycled pid is read again.

The same environment names the process's GPU, which picks its NIC (rail-optimised hosts pair
GPU i with NIC i): NCCL's profiler API does not pass the CUDA device, so diagnosis would
otherwise not know which NIC a rank uses. A single integer in `CUDA_VISIBLE_DEVICES` is the
device; otherwise the launcher's local rank (torchrun `LOCAL_RANK`, Slurm `SLURM_LOCALID`, Open
MPI, MVAPICH, MPICH), which launchers map one to one onto the host's GPUs.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Sequence

DEFAULT_KEYS = ("C4_JOB_ID", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "FLUX_JOB_ID",
                "TORCHELASTIC_RUN_ID")
LOCAL_RANK_KEYS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK",
                   "MV2_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")
MAX_JOB_LEN = 128
MAX_DEVICE = 255  # the wire's limit on a CUDA device index
MAX_ENVIRON = 1 << 20  # the kernel's limit on the environment is larger; ids sit early


class JobResolver:
    def __init__(self, proc_root: Path, keys: Sequence[str] = DEFAULT_KEYS,
                 max_cached: int = 4096) -> None:
        self.proc_root = proc_root
        self.keys = tuple(keys)
        self.max_cached = max_cached
        self._cache: OrderedDict[int, tuple[str, str | None, int | None]] = OrderedDict()

    def job_of(self, pid: int) -> str | None:
        """The job id of `pid`, or None (no such process, unreadable, no known variable)."""
        return self.lookup(pid)[0]

    def lookup(self, pid: int) -> tuple[str | None, int | None]:
        """(job id, CUDA device index) of `pid` (see the module docstring), either None: one
        /proc/<pid>/stat read for both, and both from the same process if the pid is reused."""
        start = self._start_time(pid)
        if start is None:
            self._cache.pop(pid, None)
            return None, None
        hit = self._cache.get(pid)
        if hit is not None and hit[0] == start:
            self._cache.move_to_end(pid)
            return hit[1], hit[2]
        job, dev = self._read(pid)
        self._cache[pid] = (start, job, dev)
        self._cache.move_to_end(pid)
        while len(self._cache) > self.max_cached:
            self._cache.popitem(last=False)
        return job, dev

    def _start_time(self, pid: int) -> str | None:
        fields = stat_fields(self.proc_root, pid)
        return fields[19].decode() if fields and len(fields) > 19 else None  # field 22: starttime

    def _read(self, pid: int) -> tuple[str | None, int | None]:
        try:
            with open(self.proc_root / str(pid) / "environ", "rb") as f:
                raw = f.read(MAX_ENVIRON)
        except OSError:
            return None, None
        env: dict[str, str] = {}
        for item in raw.split(b"\0"):
            name, sep, value = item.partition(b"=")
            if sep:
                env[name.decode("ascii", "replace")] = value.decode("utf-8", "replace")
        job = None
        for key in self.keys:
            found = env.get(key, "").strip()
            if 0 < len(found) <= MAX_JOB_LEN and found.isprintable():
                job = found
                break
        return job, _device(env)


def stat_fields(proc_root: Path, pid: int) -> list[bytes] | None:
    """The fields of `<proc_root>/<pid>/stat` after the command name, from field 3 (state)
    on; None if the process is gone or unreadable."""
    try:
        stat = (proc_root / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return stat.rpartition(b")")[2].split()  # the command name may contain spaces and ')'


def _device(env: dict[str, str]) -> int | None:
    for value in (env.get("CUDA_VISIBLE_DEVICES", ""), *(env.get(k, "") for k in LOCAL_RANK_KEYS)):
        value = value.strip()
        if value.isdecimal() and int(value) <= MAX_DEVICE:
            return int(value)
    return None
