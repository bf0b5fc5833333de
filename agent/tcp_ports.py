"""The planned TCP source ports file that libc4-connect.so reads at every connect()
(plugin/pathctl/connect.c; docs/planning.md, "Applying plans: TCP"), and the kernel's view of
which port each connection really uses.

Format, one rule per line: `<destination address> <destination port> <source port>`; lines
starting with `#` are comments. Several lines for one destination are several ports, tried in
order by successive connections. The agent replaces the file atomically (write, fsync, rename),
so a reader sees the old table or the new one, never half of one.
"""
from __future__ import annotations

import ipaddress
import os
import tempfile
from pathlib import Path
from typing import Iterable

Rule = tuple[str, int, int]  # (dst, dport, sport)


def norm_addr(addr: str) -> str:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ip)


class PortsFile:
    """The agent's table of planned TCP ports, keyed by assignment id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rules: dict[str, Rule] = {}

    def update(self, rules: dict[str, Rule], moved_off: Iterable[Rule] = ()) -> None:
        """Add or replace rules (an assignment id keeps one port) and rewrite the file.
        `moved_off`: (dst, dport, old port) of the connections these rules move; the rules
        that put them there go, or the next connect() would take the old port first."""
        gone = {(norm_addr(d), dp, sp) for d, dp, sp in moved_off}
        merged = {aid: r for aid, r in self.rules.items() if r not in gone}
        for aid, (dst, dport, sport) in rules.items():
            merged[aid] = (norm_addr(dst), dport, sport)
        self._write(merged)
        self.rules = merged

    def _write(self, rules: dict[str, Rule]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = ["# c4 planned TCP source ports: destination dport sport (agent/tcp_ports.py)\n"]
        lines += [f"{dst} {dport} {sport}\n" for dst, dport, sport in rules.values()]
        fd, tmp = tempfile.mkstemp(prefix=".tcp-ports.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # every training process reads it
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def planned_ports(path: Path, dst: str, dport: int) -> list[int]:
    """The ports planned for (dst, dport), in file order (what the interposer tries)."""
    try:
        text = path.read_text()
    except OSError:
        return []
    want = norm_addr(dst)
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or line.startswith("#"):
            continue
        try:
            if norm_addr(parts[0]) == want and int(parts[1]) == dport:
                out.append(int(parts[2]))
        except ValueError:
            continue
    return out


def _addr(hexaddr: str) -> str:
    raw = bytes.fromhex(hexaddr)
    # /proc/net/tcp prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return norm_addr(str(ipaddress.ip_address(words)))


def established(proc_root: Path = Path("/proc")) -> list[tuple[int, str, int]]:
    """(local port, remote address, remote port) of every ESTABLISHED TCP connection in the
    reader's network namespace."""
    out = []
    for name in ("tcp", "tcp6"):
        try:
            lines = (proc_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) < 4 or f[3] != "01":
                continue
            lport = int(f[1].rsplit(":", 1)[1], 16)
            raddr, rport = f[2].rsplit(":", 1)
            out.append((lport, _addr(raddr), int(rport, 16)))
    return out
