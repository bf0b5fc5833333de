"""Fuzz targets (issue 10): each takes bytes a peer could send and must either accept them or
refuse them the documented way. Anything else raised is a crash for the fuzzer.

- wire: `wire.decode` raises only `Rejected`;
- ingest: decode + accept on a real aggregator core (SQLite in memory, diagnosis, planner):
  no input may reach an internal error (those are contained in production, counted in
  `errors`; here they are bugs);
- plugin: `plugin_proto.decode` raises only `Malformed`;
- nccl: the collector's reassembly and report of a stream of datagrams (`u16 length` + bytes,
  repeated): the report and events it produces must pass the wire schema and encode.
"""
from __future__ import annotations

import struct
from typing import Callable

TARGETS = ("wire", "ingest", "plugin", "nccl")


def build(name: str) -> Callable[[bytes], None]:
    """The target's one-input function (imports happen here, inside atheris'
    instrumentation when run by tests/fuzz/run.py)."""
    return {"wire": _wire, "ingest": _ingest, "plugin": _plugin, "nccl": _nccl}[name]()


def _wire() -> Callable[[bytes], None]:
    from c4.core import wire

    def one(data: bytes) -> None:
        try:
            wire.decode(data)
        except wire.Rejected:
            pass
    return one


def _ingest() -> Callable[[bytes], None]:
    import logging

    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import build_core

    logging.disable(logging.CRITICAL)  # rejects log; the fuzzer's output is its own
    clock = [1000.0]
    core = build_core(AggregatorConfig(), db_path=":memory:", clock=lambda: clock[0])
    ingest = core.ingest
    n = [0]

    def one(data: bytes) -> None:
        n[0] += 1
        clock[0] += 0.25
        ingest.handle(data, clock[0])
        ingest.take_acks(clock[0])
        if n[0] % 8 == 0:
            ingest.tick(clock[0])
        if ingest.errors:
            where, _ = ingest.errors.most_common(1)[0]
            raise AssertionError(f"internal error in {where} (see the log above)")
    return one


def _plugin() -> Callable[[bytes], None]:
    from c4.agent.plugin_proto import Malformed, decode

    def one(data: bytes) -> None:
        try:
            decode(data)
        except Malformed:
            pass
    return one


def _nccl() -> Callable[[bytes], None]:
    import logging
    import tempfile
    from pathlib import Path

    import msgpack

    from c4.agent.collectors.base import Context
    from c4.agent.collectors.nccl import NcclCollector
    from c4.core.wire.kinds import validate_body

    logging.disable(logging.CRITICAL)
    ctx = Context(host="fuzz", proc_root=Path(tempfile.mkdtemp()), run_dir=Path("/nonexistent"))

    def one(data: bytes) -> None:
        c = NcclCollector(ctx, {})
        c._sock = object()  # type: ignore[assignment]  # collect() without a socket
        now = 1000.0
        for dgram in split(data):
            c._datagram(dgram, 0, 4242, now)
            now += 0.01
        if c.malformed["error"]:
            raise AssertionError("a datagram raised something other than Malformed")
        sample = c.collect(now + 1.0)
        body = {"interval": 1.0, "health": {}, "nccl": sample.section}
        msgpack.packb(validate_body("report", body))
        for ev in sample.events:
            msgpack.packb(validate_body("event", ev.body()))
    return one


def split(data: bytes) -> list[bytes]:
    """`u16 length` + datagram, repeated (the nccl target's input format)."""
    out, off = [], 0
    while off + 2 <= len(data):
        (n,) = struct.unpack_from("<H", data, off)
        out.append(data[off + 2:off + 2 + n])
        off += 2 + n
    return out


def join(datagrams: list[bytes]) -> bytes:
    return b"".join(struct.pack("<H", len(d)) + d for d in datagrams)
