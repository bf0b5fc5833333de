"""The kmsg collector on the real /dev/kmsg character device: every real record parses, the
tail mode starts after the newest record, and records written from user space (facility
`user`, which the kernel enforces) never become hardware events even if they look like one."""
from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from c4.agent.collectors.base import Context
from c4.agent.collectors.kmsg import KmsgCollector
from tests.wire_check import validate_section

DEV = Path("/dev")


@pytest.fixture
def devkmsg():
    if not (DEV / "kmsg").exists():
        pytest.skip("no /dev/kmsg")
    return DEV


def write_kmsg(text: str) -> None:
    fd = os.open(DEV / "kmsg", os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def test_history_parses_every_real_record(devkmsg):
    c = KmsgCollector(Context("h1", dev_root=devkmsg), {"history": True})
    c.start()
    try:
        s = c.collect(1.0)
    finally:
        c.close()
    validate_section("kmsg", s.section)
    assert s.section["records"] > 0 and s.section["malformed"] == 0


def test_tail_reads_new_records_and_ignores_user_space_lookalikes(devkmsg):
    tag = uuid.uuid4().hex[:8]
    c = KmsgCollector(Context("h1", dev_root=devkmsg), {})
    c.start()
    try:
        before = c.collect(1.0).section["records"]
        for i in range(3):  # `<4>`: level warning; the kernel still sets facility user
            write_kmsg(f"<4>NVRM: Xid (PCI:0000:3b:00): 79, pid={i}, name=c4-test-{tag}, "
                       "GPU has fallen off the bus.\n")
        s = c.collect(2.0)
    finally:
        c.close()
    validate_section("kmsg", s.section)
    assert s.section["records"] - before >= 3 and s.section["ignored"] >= 3
    assert s.section["malformed"] == 0 and s.section["overwritten"] == 0
    assert not [e for e in s.events if (e.attrs.get("process") or "").startswith("c4-test")]
