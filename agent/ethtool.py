"""`ethtool -S` without the ethtool binary: the SIOCETHTOOL ioctl, as ethtool(8) does it.

ETHTOOL_GSSET_INFO (or GDRVINFO.n_stats on old drivers) gives the number of stats,
ETHTOOL_GSTRINGS their names (ETH_GSTRING_LEN bytes each), ETHTOOL_GSTATS the u64 values, in
the same order. The device is looked up in the network namespace of the calling thread when
the socket is created (uapi/linux/ethtool.h for the structures).
"""
from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
ETHTOOL_GSTRINGS = 0x1B
ETHTOOL_GSTATS = 0x1D
ETHTOOL_GSSET_INFO = 0x37
ETH_SS_STATS = 1
ETH_GSTRING_LEN = 32
IFNAMSIZ = 16
DRVINFO_SIZE = 196  # struct ethtool_drvinfo
DRVINFO_N_STATS = 180  # offset of n_stats in it
MAX_STATS = 1 << 16  # sanity bound on a driver-reported count


def _capacity(count: int) -> int:
    # The kernel writes as many entries as the driver has *now*, whatever length we pass
    # (net/ethtool/ioctl.c): leave room for stats added meanwhile (e.g. `ethtool -L`).
    return 2 * count + 256


class EthtoolError(OSError):
    """The stats of a netdev cannot be read; `errno` and the message say why."""


def _ioctl(sock: socket.socket, netdev: str, buf: ctypes.Array[ctypes.c_char]) -> None:
    ifreq = struct.pack(f"{IFNAMSIZ}sP", netdev.encode(), ctypes.addressof(buf))
    ifreq += b"\0" * (40 - len(ifreq))  # sizeof(struct ifreq) on 64-bit
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


def _stat_count(sock: socket.socket, netdev: str) -> int:
    buf = ctypes.create_string_buffer(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0,
                                                  1 << ETH_SS_STATS, 0))
    try:
        _ioctl(sock, netdev, buf)
        _, _, mask, count = struct.unpack("=IIQI", buf.raw[:20])
        return count if mask & (1 << ETH_SS_STATS) else 0
    except OSError as exc:
        if exc.errno != errno.EOPNOTSUPP:
            raise
    buf = ctypes.create_string_buffer(struct.pack("=I", ETHTOOL_GDRVINFO), DRVINFO_SIZE)
    _ioctl(sock, netdev, buf)  # drivers without get_sset_count
    n: int = struct.unpack_from("=I", buf.raw, DRVINFO_N_STATS)[0]
    return n


def _names(sock: socket.socket, netdev: str, count: int) -> list[str]:
    cap = _capacity(count)
    buf = ctypes.create_string_buffer(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_STATS, count),
                                      12 + cap * ETH_GSTRING_LEN)
    _ioctl(sock, netdev, buf)
    n = struct.unpack_from("=I", buf.raw, 8)[0]
    raw = buf.raw[12:12 + min(n, cap) * ETH_GSTRING_LEN]
    return [raw[i:i + ETH_GSTRING_LEN].split(b"\0", 1)[0].decode("ascii", "replace")
            for i in range(0, len(raw), ETH_GSTRING_LEN)]


def _values(sock: socket.socket, netdev: str, count: int) -> list[int]:
    cap = _capacity(count)
    buf = ctypes.create_string_buffer(struct.pack("=II", ETHTOOL_GSTATS, count), 8 + cap * 8)
    _ioctl(sock, netdev, buf)
    n = struct.unpack_from("=I", buf.raw, 4)[0]
    return list(struct.unpack_from(f"={min(n, cap)}Q", buf.raw, 8))


def read_stats(netdev: str) -> dict[str, int]:
    """`ethtool -S <netdev>` as a dict. Raises EthtoolError (ENODEV: no such device,
    EOPNOTSUPP: the driver has no stats, ...)."""
    if not netdev or len(netdev.encode()) >= IFNAMSIZ or "/" in netdev:
        raise EthtoolError(errno.EINVAL, f"{netdev!r} is not a valid interface name")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            count = _stat_count(sock, netdev)
            if not 0 <= count <= MAX_STATS:
                raise EthtoolError(errno.EPROTO, f"{netdev}: driver reports {count} stats")
            if count == 0:
                return {}
            names = _names(sock, netdev, count)
            values = _values(sock, netdev, count)
            if len(names) != len(values):  # names and values would not line up
                raise EthtoolError(errno.EAGAIN, f"{netdev}: the stats set changed while "
                                                 "reading; retried next interval")
    except EthtoolError:
        raise
    except OSError as exc:
        code = exc.errno or errno.EIO
        raise EthtoolError(code, f"{netdev}: SIOCETHTOOL failed: {os.strerror(code)} "
                                 f"(errno {code})") from None
    return dict(zip(names, values))
