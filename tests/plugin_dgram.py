"""Builds NCCL plugin datagrams (layout: plugin/src/wire.h, agent/plugin_proto.py) for tests
and fuzzing: the hostile shapes a local process can send that the plugin itself never does."""
from __future__ import annotations

from c4.agent.plugin_proto import (
    COLL, HEADER, MAGIC, PEER, STALLED, STALLED_BLOCK, SUMMARY, SUMMARY_BLOCK, VERSION, WAITING,
)


def header(typ: int, *, rank: int = 0, nranks: int = 2, part: int = 0, nparts: int = 1,
           comm: int = 0xABC, msg_seq: int = 1, interval_ms: int = 1000, pid: int = 0,
           flags: int = 0) -> bytes:
    return HEADER.pack(MAGIC, VERSION, typ, flags, pid, rank, nranks, part, nparts, comm,
                       msg_seq, 0, interval_ms, 1, 0)


def summary(peers: list[tuple[int, int, int, int]] = (), colls: int = 0,
            entry_wait_ns: int = 0, **hdr: int) -> bytes:
    """peers: (peer, channel, dir, bytes); every wait is 1 ns."""
    body = SUMMARY_BLOCK.pack(5, 5, 0, 10, entry_wait_ns, 1, colls, len(peers), 0, 0, 0,
                              b"", 0)
    body += b"".join(COLL.pack(b"AllReduce", b"Ring", b"Simple", 1, 2**64 - 1, 10**16 - 1)
                     for _ in range(colls))
    body += b"".join(PEER.pack(p, ch, d, n, 1, 1, 1, 1) for p, ch, d, n in peers)
    return header(SUMMARY, **hdr) + body


def stalled(waiting: int = 1, **hdr: int) -> bytes:
    body = STALLED_BLOCK.pack(7, 6, 10**9, 10**9, b"AllReduce", waiting)
    body += b"".join(WAITING.pack(1, 0, 0, 10, 10**9) for _ in range(waiting))
    return header(STALLED, **hdr) + body
