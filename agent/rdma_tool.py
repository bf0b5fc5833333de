"""QPs as the kernel's RDMA netlink sees them (`rdma res show qp`), through iproute2's `rdma`.

This covers what the uprobes cannot: kernel QPs (GSI), QPs of processes in containers with
their own copy of libibverbs, and the hardware state (a QP moved to ERR by the NIC). The JSON
is the one iproute2 prints with `-j`: one flat array over all devices, one object per QP with
`ifname`, `port` (absent before the QP is bound to a port), `lqpn`, `rqpn` (RC/UC only),
`type`, `state`, `pid` and `comm` (kernel QPs: no pid, comm is the kernel module).
"""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Sequence, TypeVar

DEFAULT_COMMAND = ("rdma", "-j", "-d", "res", "show", "qp")
# What `rdma` prints when the kernel has no RDMA subsystem loaded (ib_core): no devices.
NO_RDMA = "Failed to open NETLINK_RDMA socket"
T = TypeVar("T")

Runner = Callable[..., subprocess.CompletedProcess[str]]


class RdmaToolError(RuntimeError):
    """The `rdma` tool is missing, timed out, failed or printed something that is not JSON."""


@dataclass(frozen=True)
class NetlinkQp:
    dev: str
    port: int | None
    lqpn: int
    rqpn: int | None
    qp_type: str
    state: str
    pid: int | None
    comm: str | None

    def as_dict(self) -> dict[str, Any]:
        return {"dev": self.dev, "port": self.port, "lqpn": self.lqpn, "rqpn": self.rqpn,
                "qp_type": self.qp_type, "state": self.state, "pid": self.pid,
                "comm": self.comm}


@dataclass
class Listing:
    qps: list[NetlinkQp]
    rejected: list[str]  # one reason per object that could not be used


def _uint(obj: dict[str, Any], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{key}={value!r} is not an unsigned integer")
    return value


def _str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{key}={value!r} is not a non-empty string")
    return value


def _optional(read: Callable[[dict[str, Any], str], T], obj: dict[str, Any], key: str) -> T | None:
    return None if obj.get(key) is None else read(obj, key)


def _qp(obj: Any) -> NetlinkQp:
    if not isinstance(obj, dict):
        raise ValueError(f"expected an object, got {type(obj).__name__}")
    return NetlinkQp(
        dev=_str(obj, "ifname"), port=_optional(_uint, obj, "port"),
        lqpn=_uint(obj, "lqpn"), rqpn=_optional(_uint, obj, "rqpn"),
        qp_type=_str(obj, "type"), state=_str(obj, "state"),
        pid=_optional(_uint, obj, "pid"), comm=_optional(_str, obj, "comm"))


def parse_qps(text: str) -> Listing:
    """Parse `rdma -j res show qp` output. Malformed objects are rejected with a reason and
    the rest kept; output that is not a JSON array raises RdmaToolError."""
    if not text.strip():
        return Listing([], [])
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RdmaToolError(f"rdma printed invalid JSON: {exc}") from None
    if not isinstance(doc, list):
        raise RdmaToolError(f"rdma printed a JSON {type(doc).__name__}, expected an array")
    out = Listing([], [])
    for i, obj in enumerate(doc):
        try:
            out.qps.append(_qp(obj))
        except ValueError as exc:
            out.rejected.append(f"qp[{i}]: {exc}")
    return out


def list_qps(command: Sequence[str] = DEFAULT_COMMAND, run: Runner = subprocess.run,
             timeout: float = 5.0) -> Listing:
    """Run `command` and parse its output. No RDMA subsystem means no QPs: an empty listing."""
    try:
        proc = run(list(command), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise RdmaToolError(f"{command[0]} not found (install iproute2)") from None
    except subprocess.TimeoutExpired:
        raise RdmaToolError(f"{' '.join(command)} did not finish in {timeout:g} s") from None
    if proc.returncode != 0:
        err = (proc.stderr or "").strip()
        if NO_RDMA in err:
            return Listing([], [])
        raise RdmaToolError(f"{' '.join(command)} exited {proc.returncode}: "
                            f"{err[:300] or 'no message'}")
    return parse_qps(proc.stdout)
