"""Unix sockets the agent listens on for local processes (the plugin's datagrams, the
path-control libraries)."""
from __future__ import annotations

import errno
import os
import socket
import stat
from pathlib import Path


def remove_stale(path: Path, kind: int) -> None:
    """Remove a socket file a dead agent left at `path`; raise OSError if it is not a socket
    (EEXIST) or another process still listens on it (EADDRINUSE). `kind` is the socket type."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, kind) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            os.unlink(path)
            return
    raise OSError(errno.EADDRINUSE, f"{path} is in use by another process")
