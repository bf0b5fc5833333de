"""Network-namespace plumbing for the lab: create and delete named namespaces, run code or
processes inside one, write per-namespace sysctls, find the processes a namespace holds.

Named namespaces are the `ip netns` kind (a bind mount under /run/netns), so operators can
look at the lab with `ip -n NAME ...`. Netlink work goes through pyroute2; sysctls under
/proc/sys/net are per namespace and are written from inside it (setns on this thread only).
"""
from __future__ import annotations

import ctypes
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from pyroute2 import NetNS, netns

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def create(name: str) -> None:
    netns.create(name)
    with open_ns(name) as ns:
        ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")


def remove(name: str) -> None:
    try:
        netns.remove(name)
    except OSError:
        pass  # already gone: `down` is idempotent


def listed(prefix: str) -> list[str]:
    """Named namespaces that belong to lab `prefix` (`<prefix>-...`)."""
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix + "-"))
    except FileNotFoundError:
        return []


@contextmanager
def open_ns(name: str) -> Iterator[NetNS]:
    ns = NetNS(name)
    try:
        yield ns
    finally:
        ns.close()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@contextmanager
def inside(name: str) -> Iterator[None]:
    """Run the body with this thread in namespace `name` (files opened under /proc/sys/net
    then belong to it); the thread returns to its own namespace afterwards."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(own)
    finally:
        os.close(target)
        os.close(own)


def sysctls(name: str, values: dict[str, str | int]) -> None:
    """Write `net.ipv4.ip_forward`-style keys inside namespace `name`. A key the running kernel
    does not have (an optional one such as the multipath hash seed) is skipped."""
    with inside(name):
        for key, value in values.items():
            path = Path("/proc/sys") / key.replace(".", "/")
            try:
                path.write_text(f"{value}\n")
            except FileNotFoundError:
                continue


def enter_fn(name: str) -> Callable[[], None]:
    """A `preexec_fn` that moves a child process into namespace `name` before exec (only the
    network namespace: the child keeps the host's /sys and /proc mounts, unlike
    `ip netns exec`, so tracefs and cgroupfs stay where BCC and the agent expect them)."""
    path = str(NETNS_DIR / name)

    def enter() -> None:
        fd = os.open(path, os.O_RDONLY)
        _setns(fd)
        os.close(fd)

    return enter


def pids(name: str) -> list[int]:
    """Processes whose network namespace is `name` (what `ip netns pids` does)."""
    try:
        target = os.stat(NETNS_DIR / name).st_ino
    except FileNotFoundError:
        return []
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == target:
                    out.append(int(entry))
            except OSError:
                continue
    return out


def run(name: str, *argv: str, input: str | None = None) -> str:
    """Run a tool pyroute2 has no netlink API for (nft, ethtool) inside namespace `name`."""
    proc = subprocess.run(["ip", "netns", "exec", name, *argv], input=input, text=True,
                          capture_output=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} in {name}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout
