from __future__ import annotations

from pathlib import Path

import pytest

from c4.core import record


def test_roundtrip_and_append(tmp_path: Path) -> None:
    p = tmp_path / "r.c4rec"
    with record.Writer(p) as w:
        w.write(b"one")
        w.write(b"")
    with record.Writer(p) as w:  # appending does not repeat the magic
        w.write(b"three")
    assert list(record.read(p)) == [b"one", b"", b"three"]


def test_truncated_tail_is_ignored(tmp_path: Path) -> None:
    p = tmp_path / "r.c4rec"
    with record.Writer(p) as w:
        w.write(b"complete")
        w.write(b"cut short")
    p.write_bytes(p.read_bytes()[:-3])
    assert list(record.read(p)) == [b"complete"]


def test_not_a_recording(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(b"hello world")
    with pytest.raises(record.RecordError, match="bad magic"):
        list(record.read(p))
