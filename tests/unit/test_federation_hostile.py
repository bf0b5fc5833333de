"""A hostile peer on the owner's federation socket (aggregator/federation.py `receive`): forward
headers and streams that must cost a counted reject (or a duplicate, or nothing) and never move
the owner's stream state backwards. Real ZeroMQ (inproc, no CURVE: the header names the
sender; the CURVE/ZAP check of a sender's key is in test_federation.py) and real diagnosis.
The same path is fuzzed by tests/fuzz (target `federation`)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.federation import Federation, FederationConfig, Peer
from c4.aggregator.server import build_core
from c4.core.wire import Frame
from tests.fuzz.targets import BOOTS, PEERS, frames

BOOT = BOOTS[0]


class Owner:
    """Aggregator "a" of peers a, b, c, and a socket speaking to its federation socket."""

    def __init__(self, tmp: Path) -> None:
        self.core = build_core(AggregatorConfig(), db_path=":memory:", clock=lambda: 1000.0)
        cfg = FederationConfig(name="a", listen=f"inproc://fed-{id(self)}", peers=[
            Peer(n, f"ipc://{tmp}/{n}") for n in PEERS])
        self.fed = Federation(cfg, "f" * 16, None, 1 << 20, self.core.ingest.prepare,
                              self.core.registry)
        self.peer = self.fed.zctx.socket(zmq.DEALER)
        self.peer.setsockopt(zmq.LINGER, 0)
        self.peer.connect(cfg.listen)
        self.applied: list[Frame] = []

    def send(self, head: Any, frame: bytes = b"") -> list[dict[str, Any]]:
        """One message (a dict header is packed), received by the owner; its acks."""
        raw = head if isinstance(head, bytes) else msgpack.packb(head)
        self.peer.send_multipart([raw, frame or frames()[1 * 4 + 2]])  # a's job, h2
        self.fed.receive(self._apply)
        acks = []
        while self.peer.poll(100):
            acks.append(msgpack.unpackb(self.peer.recv()))
        return acks

    def _apply(self, good: list[Frame]) -> None:
        self.applied += good
        for f in good:
            self.core.diagnosis.observe(f, 1000.0)

    def close(self) -> None:
        self.peer.close(0)
        self.fed.close()


@pytest.fixture
def owner(tmp_path: Path) -> Iterator[Owner]:
    o = Owner(tmp_path)
    yield o
    o.close()


def head(fseq: Any, floor: Any = 1, sender: Any = "b", boot: Any = BOOT) -> dict[str, Any]:
    return {"from": sender, "boot": boot, "fseq": fseq, "floor": floor}


def test_booleans_are_not_sequence_numbers(owner: Owner) -> None:
    """`fseq: true` passed `isinstance(int)` and 1 <= True: it was applied, `applied` became
    a bool and the ack echoed it (found by the fuzz target)."""
    for bad in (head(True), head(1, floor=True), head(True, floor=True)):
        assert owner.send(bad) == []
    assert owner.fed.rejected["malformed"] == 3 and owner.fed.received == 0
    assert "b" not in owner.fed.inbound and not owner.applied
    assert owner.send(head(1)) == [{"boot": BOOT, "fseq": 1}]
    assert type(owner.fed.inbound["b"].applied) is int and owner.fed.received == 1
