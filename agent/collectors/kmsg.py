"""`kmsg` collector: follows `<dev_root>/kmsg` and turns hardware-fault messages into events
(docs/collectors.md#collectors-rdma-pfc-kmsg).

On the character device each read() returns one record; EAGAIN means nothing new and EPIPE
that the ring buffer overwrote records we had not read yet (the next read resumes at the
oldest record left). A regular file named `kmsg` (tests, replaying a capture) is read line by
line up to EOF and followed as it grows.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from typing import Any, Iterator, Mapping

from ..kmsg_parse import Malformed, Match, classify, group_lines, parse_record
from .base import Collector, CollectorUnavailable, Context, Event, Sample
from .options import check_keys, get_bool

READ_SIZE = 16384  # > CONSOLE_EXT_LOG_MAX (8 KiB): a whole record always fits
MAX_RECORDS = 50_000  # per collect, so a printk flood cannot hold the agent's loop
KERNEL_FACILITY = 0
MSG_MAX = 2048


class KmsgCollector(Collector):
    name = "kmsg"

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        check_keys(self.name, options, ("history",))
        self.history = get_bool(self.name, options, "history", False)
        self.path = ctx.dev_root / "kmsg"
        self._fd: int | None = None
        self._chardev = False
        self._partial = b""  # regular file: bytes after the last newline
        self._last_seq: int | None = None
        self._lost = False  # EPIPE seen: the next record follows a gap
        self.counts: Counter[str] = Counter()
        self.by_type: Counter[str] = Counter()

    def start(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CollectorUnavailable(f"{self.path} does not exist") from None
        except PermissionError:
            raise CollectorUnavailable(f"reading {self.path} needs root or CAP_SYSLOG "
                                       "(kernel.dmesg_restrict=1)") from None
        except OSError as exc:
            raise CollectorUnavailable(f"cannot open {self.path}: {exc.strerror}") from None
        self._chardev = stat.S_ISCHR(os.fstat(fd).st_mode)
        if not self.history:
            os.lseek(fd, 0, os.SEEK_END)  # /dev/kmsg: just after the newest record
        self._fd = fd

    def collect(self, now: float) -> Sample:
        if self._fd is None:
            raise RuntimeError("kmsg collector used before start()")
        events: list[Event] = []
        for lines in self._chunks():
            self.counts["records"] += 1
            try:
                record = parse_record(lines)
            except Malformed as exc:
                self.counts["malformed"] += 1
                if self.counts["malformed"] <= 10:  # enough to diagnose, bounded
                    self.ctx.log.warning("kmsg: rejected record: %s", exc)
                continue
            self._note_seq(record.seq)
            match = classify(record.message) if record.facility == KERNEL_FACILITY else None
            if match is None:
                self.counts["ignored"] += 1
                continue
            self.counts["events"] += 1
            if _details_previous(match, events):
                continue  # the detail line of an AER message already reported
            self.by_type[match.type] += 1
            events.append(Event(match.type, match.severity, match.attrs,
                                record.message[:MSG_MAX], match.device))
        section: dict[str, Any] = {k: self.counts[k] for k in
                                   ("records", "events", "ignored", "malformed", "overwritten")}
        section["by_type"] = dict(self.by_type)
        return Sample(section, events)

    def _note_seq(self, seq: int) -> None:
        if self._last_seq is not None and seq > self._last_seq + 1:
            self.counts["overwritten"] += seq - self._last_seq - 1
        elif self._lost:
            self.counts["overwritten"] += 1  # gap of unknown size (first read after start)
        self._lost = False
        self._last_seq = seq

    def _chunks(self) -> Iterator[list[str]]:
        """Records as lists of lines (header, then dictionary lines)."""
        if not self._chardev:
            yield from group_lines(self._file_lines())
            return
        assert self._fd is not None
        for _ in range(MAX_RECORDS):
            try:
                data = os.read(self._fd, READ_SIZE)
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    self._lost = True
                    continue
                self.ctx.log.warning("kmsg: read %s failed: %s", self.path, exc.strerror)
                return
            if not data:
                return
            yield data.decode("utf-8", "replace").rstrip("\n").split("\n")

    def _file_lines(self) -> list[str]:
        assert self._fd is not None
        data = self._partial
        while chunk := os.read(self._fd, 1 << 16):
            data += chunk
        complete, _, self._partial = data.rpartition(b"\n")
        if not complete:
            return []
        return complete.decode("utf-8", "replace").split("\n")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _details_previous(match: Match, events: list[Event]) -> bool:
    """The kernel prints one AER error as `AER: ... error received: <dev>` followed by
    `<dev>: PCIe Bus Error: severity=..., type=<layer>`: fold the second into the first."""
    if match.type != "pcie_aer" or match.attrs["port"] is not None or not events:
        return False
    prev = events[-1]
    if (prev.type == "pcie_aer" and prev.attrs["port"] is not None and "layer" not in prev.attrs
            and prev.attrs["pci"] == match.attrs["pci"]
            and prev.attrs["severity"] == match.attrs["severity"]):
        prev.attrs["layer"] = match.attrs["layer"]
        return True
    return False
