"""QP lifecycle of verbs applications (NCCL, any libibverbs user) from uprobes on libibverbs,
with the RoCEv2 UDP source port each QP uses (c4.core.roce), plus the kernel's QP list.

Uprobes on a library path apply to every process that maps that file, running now or started
later; no process needs restarting and nothing is injected into it.
"""
from __future__ import annotations

import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from c4.core.roce import sport_for_qp
from c4.core.wire.sections.verbs_qp import MAX_QPS_PER_REPORT, QP_STATES

from ..bpf import BPF_DIR, load
from ..elf_symbols import ElfError, elf_machine, find_function
from ..rdma_tool import DEFAULT_COMMAND, RdmaToolError, list_qps
from .base import Collector, CollectorUnavailable, Context, OptionError, Sample
from .options import check_keys, get_bool, get_int, get_str_list

LIBRARY_SONAME = "libibverbs.so.1"
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")

# enum ibv_qp_type values (<infiniband/verbs.h>; checked by tests/unit/test_verbs_qp_abi.py)
QP_TYPE_NAMES = {2: "RC", 3: "UC", 4: "UD", 8: "RAW_PACKET", 9: "XRC_SEND", 10: "XRC_RECV",
                 255: "DRIVER"}
# QP types whose RoCEv2 source port mlx5 derives from the QP numbers (rdma_get_udp_sport)
SPORT_TYPES = frozenset({"RC", "UC", "XRC_SEND", "XRC_RECV"})
IBV_QP_PORT = 1 << 5
IBV_QP_AV = 1 << 7
IBV_QP_DEST_QPN = 1 << 20
# order of enum stat_index in bpf/verbs_qp.c
BPF_STATS = ("creates", "create_failed", "modifies", "modify_failed", "destroys",
             "destroy_failed", "map_full", "unreported", "read_failed")
# (symbol, entry program, return program)
PROBES = (("ibv_create_qp", None, b"create_qp_return"),
          ("ibv_modify_qp", b"modify_qp_entry", b"modify_qp_return"),
          ("ibv_destroy_qp", b"destroy_qp_entry", b"destroy_qp_return"))

Key = tuple[int, int]  # (pid, lqpn)


@dataclass(frozen=True)
class RawQp:
    """One entry of the `qps` eBPF map as plain values."""

    pid: int
    qpn: int
    comm: bytes
    qp_type: int
    state: int
    dest_qpn: int
    flow_label: int
    known: int  # IBV_QP_* bits whose fields are valid
    port: int
    ah_port: int
    dgid: bytes
    modifies: int
    modify_failed: int
    destroyed: bool


def format_gid(raw: bytes) -> str:
    """16 bytes -> the GID text form sysfs and `ibv_devinfo` print (8 groups of 4 hex)."""
    h = raw.hex()
    return ":".join(h[i:i + 4] for i in range(0, 32, 4))


def qp_entry(raw: RawQp, exited: bool = False) -> dict[str, Any]:
    """The wire form of one QP (c4/core/wire/sections/verbs_qp.py QP)."""
    qp_type = QP_TYPE_NAMES.get(raw.qp_type, "UNKNOWN")
    rqpn = raw.dest_qpn if raw.known & IBV_QP_DEST_QPN else None
    has_av = bool(raw.known & IBV_QP_AV)
    if raw.known & IBV_QP_PORT:
        port: int | None = raw.port
    else:
        port = raw.ah_port if has_av else None
    # A RoCE address vector is always global: a zero dgid means no GRH, hence no UDP header.
    routed = has_av and any(raw.dgid)
    sport = (sport_for_qp(raw.qpn, rqpn, raw.flow_label)
             if qp_type in SPORT_TYPES and rqpn is not None and routed else None)
    entry = {
        "pid": raw.pid,
        "comm": raw.comm.split(b"\0", 1)[0].decode(errors="replace"),
        "lqpn": raw.qpn,
        "rqpn": rqpn,
        "qp_type": qp_type,
        "state": QP_STATES[raw.state] if raw.state < len(QP_STATES) else "UNKNOWN",
        "port": port,
        "dgid": format_gid(raw.dgid) if has_av else None,
        "flow_label": raw.flow_label if has_av else None,
        "sport": sport,
        "destroyed": raw.destroyed or exited,
        "modifies": raw.modifies,
        "modify_failed": raw.modify_failed,
    }
    if exited:
        entry["exited"] = True
    return entry


class QpReporter:
    """Chooses the QPs of each report within a budget: changed ones first (new, modified,
    destroyed), then unchanged live ones round-robin, so the aggregator converges on the full
    table however many QPs a host has, with each frame bounded."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._sent: dict[Key, dict[str, Any]] = {}  # last content sent, live QPs only
        self._cursor: Key | None = None  # last unchanged QP refreshed

    def select(self, entries: Mapping[Key, dict[str, Any]]
               ) -> tuple[list[dict[str, Any]], int, list[Key]]:
        """-> (QPs to report, changed QPs deferred, destroyed QPs reported: evict them)."""
        self._sent = {k: v for k, v in self._sent.items() if k in entries}
        changed = sorted(k for k, v in entries.items() if self._sent.get(k) != v)
        picked = changed[:self.budget]
        room = self.budget - len(picked)
        if room > 0:
            skip = set(changed)
            unchanged = sorted(k for k in entries if k not in skip)
            start = next((i for i, k in enumerate(unchanged)
                          if self._cursor is not None and k > self._cursor), 0)
            refresh = (unchanged[start:] + unchanged[:start])[:room]
            if refresh:
                self._cursor = refresh[-1]
            picked += refresh
        done = []
        for k in picked:
            if entries[k]["destroyed"]:
                self._sent.pop(k, None)
                done.append(k)
            else:
                self._sent[k] = entries[k]
        return [entries[k] for k in picked], max(0, len(changed) - self.budget), done


def find_library(run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run) -> Path:
    """libibverbs.so.1 for this machine's architecture: from `ldconfig -p`, else the
    standard library directories."""
    candidates: list[Path] = []
    try:
        out = run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
        candidates += [Path(line.rsplit("=>", 1)[1].strip()) for line in out.splitlines()
                       if line.strip().startswith(LIBRARY_SONAME + " ") and "=>" in line]
    except (OSError, subprocess.SubprocessError):
        pass  # no ldconfig: the directory scan below still finds a standard install
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates += [Path(d) / LIBRARY_SONAME for d in (
        f"/lib/{multiarch}", f"/usr/lib/{multiarch}", "/usr/lib64", "/lib64", "/usr/lib")]
    own = elf_machine(Path(sys.executable))
    for path in candidates:
        try:
            if elf_machine(path) == own:
                return path.resolve()
        except ElfError:
            continue
    raise CollectorUnavailable(f"{LIBRARY_SONAME} not found (install rdma-core/libibverbs1, "
                               "or set collectors.verbs_qp.library)")


class VerbsQpCollector(Collector):
    name = "verbs_qp"
    OPTIONS = ("library", "pids", "max_qps", "max_report", "netlink", "rdma_command")

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        check_keys(self.name, options, self.OPTIONS)
        library = options.get("library")
        if library is not None and (not isinstance(library, str) or not library):
            raise OptionError(f"collectors.verbs_qp.library: expected a path, got {library!r}")
        self.library = Path(library) if library else None
        self.pids: list[int] = options.get("pids", [])
        if not isinstance(self.pids, list) or not all(
                isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in self.pids):
            raise OptionError(f"collectors.verbs_qp.pids: expected a list of positive process "
                              f"ids, got {self.pids!r}")
        self.max_qps = get_int(self.name, options, "max_qps", 65536, 1, 1 << 20)
        self.max_report = get_int(self.name, options, "max_report", 1000, 1, MAX_QPS_PER_REPORT)
        self.netlink = get_bool(self.name, options, "netlink", True)
        command = get_str_list(self.name, options, "rdma_command")
        if command == []:
            raise OptionError("collectors.verbs_qp.rdma_command: expected a command, got []")
        self.rdma_command = command or list(DEFAULT_COMMAND)
        self._bpf: Any = None
        self._reporter = QpReporter(self.max_report)
        self._netlink_errors = 0
        self._netlink_rejected = 0
        self._last_netlink_error: str | None = None

    def start(self) -> None:
        if not (UPROBE_PMU.exists() or UPROBE_EVENTS.exists()):
            raise CollectorUnavailable("kernel has no uprobes (CONFIG_UPROBE_EVENTS)")
        library = self.library or find_library()
        if not library.is_file():
            raise CollectorUnavailable(f"collectors.verbs_qp.library {library} does not exist")
        try:
            symbols = {sym: find_function(library, sym) for sym, _, _ in PROBES}
        except ElfError as exc:
            raise CollectorUnavailable(f"cannot attach to {library}: {exc}") from None
        cflags = [f"-I{BPF_DIR}", f"-DMAX_QPS={self.max_qps}"]
        if self.pids:
            cflags.append("-DFILTER_PIDS")
        bpf = load("verbs_qp.c", cflags=cflags)
        try:
            for sym, entry, ret in PROBES:
                addr = symbols[sym].address
                if entry:
                    bpf.attach_uprobe(name=bytes(library), addr=addr, fn_name=entry, pid=-1)
                bpf.attach_uretprobe(name=bytes(library), addr=addr, fn_name=ret, pid=-1)
        except Exception as exc:  # BCC raises bare Exception when a probe cannot attach
            bpf.cleanup()
            raise CollectorUnavailable(f"attaching uprobes to {library} failed: {exc}") from None
        if self.pids:
            table = bpf[b"pid_filter"]
            for pid in self.pids:
                table[table.Key(pid)] = table.Leaf(1)
        self._bpf = bpf
        self.ctx.log.info("verbs_qp: uprobes on %s (%s)", library,
                          ", ".join(f"{s.name}@{s.version}" for s in symbols.values()))

    def _read_map(self) -> dict[Key, RawQp]:
        out = {}
        for k, v in self._bpf[b"qps"].items():
            out[(k.pid, k.qpn)] = RawQp(
                pid=k.pid, qpn=k.qpn, comm=bytes(v.comm), qp_type=v.qp_type, state=v.state,
                dest_qpn=v.dest_qpn, flow_label=v.flow_label, known=v.known, port=v.port,
                ah_port=v.ah_port, dgid=bytes(v.dgid), modifies=v.modifies,
                modify_failed=v.modify_failed, destroyed=bool(v.destroyed))
        return out

    def _has_rdma_devices(self) -> bool:
        devices = self.ctx.sysfs_root / "class" / "infiniband"
        return devices.is_dir() and any(devices.iterdir())

    def _netlink(self, section: dict[str, Any]) -> None:
        try:
            listing = list_qps(self.rdma_command)
        except RdmaToolError as exc:
            self._netlink_errors += 1
            section["netlink_error"] = str(exc)
            if str(exc) != self._last_netlink_error:
                self.ctx.log.warning("verbs_qp: %s", exc)
            self._last_netlink_error = str(exc)
            return
        self._last_netlink_error = None
        if listing.rejected:
            self._netlink_rejected += len(listing.rejected)
            self.ctx.log.warning("verbs_qp: rejected %d rdma QP object(s): %s",
                                 len(listing.rejected), listing.rejected[0])
        section["netlink"] = [q.as_dict() for q in listing.qps[:self.max_report]]

    def collect(self, now: float) -> Sample:
        raw = self._read_map()
        alive = {pid: (self.ctx.proc_root / str(pid)).exists() for pid in {k[0] for k in raw}}
        entries = {k: qp_entry(r, exited=not r.destroyed and not alive[r.pid])
                   for k, r in raw.items()}
        qps, deferred, done = self._reporter.select(entries)
        table = self._bpf[b"qps"]
        for pid, qpn in done:
            table.pop(table.Key(pid, qpn), None)
        section: dict[str, Any] = {
            "qps": qps,
            "live": sum(not e["destroyed"] for e in entries.values()),
            "deferred": deferred,
        }
        if self.netlink and self._has_rdma_devices():
            self._netlink(section)
        counters = [c.value for c in self._bpf[b"stats"].values()]
        section["stats"] = {**dict(zip(BPF_STATS, counters)),
                            "netlink_errors": self._netlink_errors,
                            "netlink_rejected": self._netlink_rejected}
        return Sample(section)

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None
