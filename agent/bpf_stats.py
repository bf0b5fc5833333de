"""Run counts and run time of the agent's own eBPF programs, as ebpf_exporter exports them.

The kernel counts a program's runs and the nanoseconds spent in it only while statistics are
enabled: `bpf(BPF_ENABLE_STATS, BPF_STATS_RUN_TIME)` turns them on for as long as the returned
file descriptor stays open (needs CAP_SYS_ADMIN; the same switch as the sysctl
`kernel.bpf_stats_enabled`, but it cannot be left on by a crashed agent). Each program's
counters come from `bpf(BPF_OBJ_GET_INFO_BY_FD)` on the program file descriptors this process
holds (BCC keeps one per loaded program), found in /proc/self/fd as `anon_inode:bpf-prog`.
"""
from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from pathlib import Path

# <linux/bpf.h>: enum bpf_cmd and struct bpf_prog_info offsets (stable UAPI; the kernel
# zero-fills fields it does not know and accepts a shorter buffer from older userspace).
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ENABLE_STATS = 32
BPF_STATS_RUN_TIME = 0
_INFO_SIZE = 232
_OFF_TYPE, _OFF_ID, _OFF_TAG, _OFF_NAME, _OFF_RUN_TIME, _OFF_RUN_CNT = 0, 4, 8, 64, 192, 200
_OFF_MISSES = 208
_SYS_BPF = {"x86_64": 321, "aarch64": 280, "ppc64le": 361, "s390x": 351}
# enum bpf_prog_type, the ones an observability agent loads
PROG_TYPES = {1: "socket_filter", 2: "kprobe", 5: "tracepoint", 7: "perf_event",
              17: "raw_tracepoint", 26: "tracing", 28: "ext", 29: "lsm"}

_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ProgStats:
    id: int
    name: str
    tag: str
    type: str
    run_count: int
    run_time_ns: int
    # runs the kernel skipped, counted whether statistics are on or not: a tracepoint or
    # kprobe program does not run while another one runs on the same CPU (a softirq's
    # kfree_skb interrupting a tcp_probe, say), so what it counts is a lower bound
    missed: int = 0


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(0, f"bpf() syscall number unknown on {platform.machine()}")
    ret = _libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, ctypes.c_uint(len(attr)))
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def enable_stats() -> int:
    """Turn on run-time statistics for every BPF program; returns the fd that keeps them on."""
    attr = ctypes.create_string_buffer(BPF_STATS_RUN_TIME.to_bytes(4, "little"), 8)
    return _bpf(BPF_ENABLE_STATS, attr)


def prog_info(fd: int) -> ProgStats:
    info = ctypes.create_string_buffer(_INFO_SIZE)
    attr = ctypes.create_string_buffer(16)  # struct { u32 bpf_fd; u32 info_len; u64 info; }
    ctypes.memmove(attr, fd.to_bytes(4, "little") + _INFO_SIZE.to_bytes(4, "little")
                   + ctypes.addressof(info).to_bytes(8, "little"), 16)
    _bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    raw = info.raw

    def u(off: int, size: int) -> int:
        return int.from_bytes(raw[off:off + size], "little")

    ptype = u(_OFF_TYPE, 4)
    return ProgStats(id=u(_OFF_ID, 4), name=raw[_OFF_NAME:_OFF_NAME + 16].split(b"\0")[0].decode(
                         "ascii", "replace"),
                     tag=raw[_OFF_TAG:_OFF_TAG + 8].hex(), type=PROG_TYPES.get(ptype, str(ptype)),
                     run_count=u(_OFF_RUN_CNT, 8), run_time_ns=u(_OFF_RUN_TIME, 8),
                     missed=u(_OFF_MISSES, 8))


def own_programs(fd_dir: Path = Path("/proc/self/fd")) -> list[ProgStats]:
    """Every BPF program this process holds, once each (a program may have several fds)."""
    seen: dict[int, ProgStats] = {}
    try:
        fds = [int(n) for n in os.listdir(fd_dir) if n.isdigit()]
    except OSError:
        return []
    for fd in fds:
        try:
            if os.readlink(fd_dir / str(fd)) != "anon_inode:bpf-prog":
                continue
            st = prog_info(fd)
        except OSError:  # closed meanwhile (the listing's own fd among them)
            continue
        seen.setdefault(st.id, st)
    return sorted(seen.values(), key=lambda s: s.id)
