"""The agent's on-disk copy of its unacked frames, so at-least-once delivery holds across agent
restarts (issue 10): a partition followed by a restart used to lose every frame held in memory.

One append-only file per agent incarnation (`<boot>.spool`) in `spool_dir`, records of
`type (1 byte) | seq (8) | length (4) | payload`:
- `F`: a frame as sent (its encoded bytes);
- `A`: every frame up to `seq` is settled (acked, or dropped by the byte budget);
- `X`: the frame `seq` alone is settled (refused by the aggregator).
A restarted agent reads the files of earlier boots and resends what was not settled, under the
boot and seq each frame had (the aggregator acks per boot). A file is rewritten without its
settled frames once they are most of it, and deleted when nothing in it is left. A torn last
record (a crash mid-write) ends that file's replay. Writes are plain write(2), not fsync: they
survive the agent being killed, not the host losing power.
"""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import Callable

REC = struct.Struct("<cQI")
SUFFIX = ".spool"
TMP_SUFFIX = ".tmp"
COMPACT_MIN = 1 << 20  # rewrite a file once it is this big and mostly settled


class Spool:
    def __init__(self, directory: str | Path, boot: str, log: logging.Logger) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.boot = boot
        self.log = log
        self._files: dict[str, _File] = {}

    def load(self) -> dict[str, list[tuple[int, bytes]]]:
        """Unsettled frames of earlier boots, oldest file first: {boot: [(seq, data), ...]}.
        Files with nothing left are deleted, and so are rewrites a crash cut short (the .spool
        they were to replace is intact)."""
        for tmp in self.dir.glob("*" + TMP_SUFFIX):
            tmp.unlink(missing_ok=True)
        out: dict[str, list[tuple[int, bytes]]] = {}
        paths = sorted(self.dir.glob("*" + SUFFIX), key=lambda p: p.stat().st_mtime)
        for path in paths:
            boot = path.name[:-len(SUFFIX)]
            if boot == self.boot:
                continue
            frames = _read(path, self.log)
            if frames:
                out[boot] = frames
                self._files[boot] = _File(path)
            else:
                path.unlink(missing_ok=True)
        return out

    def append(self, boot: str, seq: int, data: bytes) -> None:
        self._file(boot).write(b"F", seq, data)

    def settle(self, boot: str, seq: int, live: Callable[[], list[tuple[int, bytes]]]) -> None:
        """Frames of `boot` up to `seq` are settled; `live()`: what is still held after that,
        asked for only when it decides something (every ack must not copy the queue)."""
        f = self._files.get(boot)
        if f is None:
            return
        if boot != self.boot and not live():
            f.close()
            f.path.unlink(missing_ok=True)
            del self._files[boot]
            return
        f.write(b"A", seq, b"")
        if f.size >= COMPACT_MIN:
            frames = live()
            if sum(len(d) for _, d in frames) * 2 < f.size:
                f.rewrite(frames)

    def forget(self, boot: str, seq: int) -> None:
        f = self._files.get(boot)
        if f is not None:
            f.write(b"X", seq, b"")

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _file(self, boot: str) -> _File:
        f = self._files.get(boot)
        if f is None:
            f = self._files[boot] = _File(self.dir / f"{boot}{SUFFIX}")
        return f


class _File:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.size = os.fstat(self.fd).st_size

    def write(self, kind: bytes, seq: int, payload: bytes) -> None:
        rec = REC.pack(kind, seq, len(payload)) + payload
        os.write(self.fd, rec)
        self.size += len(rec)

    def rewrite(self, live: list[tuple[int, bytes]]) -> None:
        tmp = self.path.with_suffix(TMP_SUFFIX)
        with open(tmp, "wb") as out:
            for seq, data in live:
                out.write(REC.pack(b"F", seq, len(data)) + data)
        os.replace(tmp, self.path)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        os.close(self.fd)


def _read(path: Path, log: logging.Logger) -> list[tuple[int, bytes]]:
    frames: dict[int, bytes] = {}
    data = path.read_bytes()
    off = 0
    while off + REC.size <= len(data):
        kind, seq, n = REC.unpack_from(data, off)
        if off + REC.size + n > len(data):
            break
        payload = data[off + REC.size:off + REC.size + n]
        off += REC.size + n
        if kind == b"F":
            frames[seq] = payload
        elif kind == b"A":
            frames = {s: d for s, d in frames.items() if s > seq}
        elif kind == b"X":
            frames.pop(seq, None)
        else:
            log.warning("spool %s: unknown record at byte %d: the rest is ignored", path, off)
            break
    return sorted(frames.items())
