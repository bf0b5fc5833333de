"""Recorded frame streams: what `c4 agent run --record FILE` writes, `c4 sim` generates and
`c4 replay FILE` reads.

Format: the 8-byte magic b"C4REC1\\n\\0", then records of a 4-byte big-endian length followed by
that many bytes of one wire frame exactly as sent. Raw frames (not re-encoded objects) so a
replay goes through the same decode and validation as live ingest.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO, Iterator

MAGIC = b"C4REC1\n\0"
_LEN = struct.Struct(">I")
MAX_RECORD = 64 << 20


class RecordError(ValueError):
    pass


class Writer:
    """Appends frames; a new or empty file gets the magic first."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f: BinaryIO = open(self.path, "ab")
        if self._f.tell() == 0:
            self._f.write(MAGIC)

    def write(self, frame: bytes) -> None:
        self._f.write(_LEN.pack(len(frame)))
        self._f.write(frame)

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(path: str | Path) -> Iterator[bytes]:
    """Yield each recorded frame. A truncated tail (a writer killed mid-record) ends the
    stream quietly; a bad magic or an absurd length raises RecordError."""
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise RecordError(f"{path}: not a c4 recording (bad magic)")
        while True:
            head = f.read(_LEN.size)
            if len(head) < _LEN.size:
                return
            (n,) = _LEN.unpack(head)
            if n > MAX_RECORD:
                raise RecordError(f"{path}: record of {n} bytes at offset {f.tell() - 4}")
            data = f.read(n)
            if len(data) < n:
                return
            yield data
