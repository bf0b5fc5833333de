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
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.federation import Federation, FederationConfig, Peer
from c4.aggregator.metrics import FederationMetrics
from c4.aggregator.server import build_core
from c4.core import wire
from c4.core.wire import Frame
from tests.fuzz.targets import BOOTS, PEERS, frames

BOOT = BOOTS[0]


class Owner:
    """Aggregator "a" of peers a, b, c, and a socket speaking to its federation socket."""

    def __init__(self, tmp: Path, **fed: Any) -> None:
        self.core = build_core(AggregatorConfig(), db_path=":memory:", clock=lambda: 1000.0)
        cfg = FederationConfig(name="a", listen=f"inproc://fed-{id(self)}", peers=[
            Peer(n, f"ipc://{tmp}/{n}") for n in PEERS], **fed)
        self.fed = Federation(cfg, "f" * 16, None, 1 << 20, self.core.ingest.prepare,
                              self.core.registry, host_expire_s=60.0)
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


def test_a_stream_never_goes_back_within_a_boot(owner: Owner) -> None:
    """A floor past what was applied counts the frames between as lost and never moves back;
    a resend below it is a duplicate; another boot is a new stream from its floor."""
    assert owner.send(head(1)) == [{"boot": BOOT, "fseq": 1}]
    assert owner.send(head(9, floor=6)) == [{"boot": BOOT, "fseq": 5}]  # 2-5 lost, 6-8 awaited
    st = owner.fed.inbound["b"]
    assert (st.applied, st.lost) == (5, 4)
    assert owner.send(head(3, floor=2)) == [{"boot": BOOT, "fseq": 5}]  # an old floor: nothing
    assert owner.send(head(6, floor=6)) == [{"boot": BOOT, "fseq": 6}]
    assert (st.applied, st.lost, owner.fed.duplicates, owner.fed.received) == (6, 4, 1, 2)
    top = (1 << 62) - 1  # the largest fseq: applied, and nothing follows it in this boot
    assert owner.send(head(top, floor=top)) == [{"boot": BOOT, "fseq": top}]
    assert owner.send(head(top + 1, floor=top + 1)) == []
    assert owner.fed.rejected["malformed"] == 1 and owner.fed.inbound["b"].applied == top
    other = BOOTS[1]  # the peer restarted: its new stream starts where its floor says
    assert owner.send(head(1, boot=other)) == [{"boot": other, "fseq": 1}]
    assert owner.fed.inbound["b"].boot == other and owner.fed.received == 4


def test_strangers_shapes_and_bad_headers_are_counted_and_hold_nothing(owner: Owner) -> None:
    bad: list[Any] = [
        head(1, sender="a"), head(1, sender="zz"), head(1, sender=7),  # itself, no peer
        head(1, boot="no boot!"), head(1, boot="b" * 65), head(0, floor=0), head(2, floor=3),
        head(-1, floor=-2), head((1 << 64) - 1), {**head(1), "x": 0}, [1, 2, 3, 4], b"\xc1",
        b"\x81" * 100 + b"\xc0", msgpack.packb({**head(1), "boot": "\xff" * 300}),
    ]
    for h in bad:
        assert owner.send(h) == [], h
    assert owner.fed.rejected["identity"] == 2
    assert owner.fed.rejected["malformed"] == len(bad) - 2
    owner.peer.send_multipart([msgpack.packb(head(1))])  # the header alone
    owner.peer.send_multipart([msgpack.packb(head(1)), b"", b""])  # a part too many
    owner.fed.receive(owner._apply)
    assert owner.fed.rejected["malformed"] == len(bad)
    assert owner.fed.inbound == {} and owner.fed.received == 0 and not owner.applied


def test_the_owner_holds_a_bounded_number_of_unread_forwards(tmp_path: Path) -> None:
    """ZeroMQ's default receive queue is 1,000 messages per connection, of up to twice
    max_frame each (2 GiB with the default 1 MiB): the owner bounds it by bytes instead,
    `queue_bytes` per connection as the sender bounds its own queue."""
    o = Owner(tmp_path)
    try:
        o.peer.setsockopt(zmq.SNDHWM, 1)
        o.peer.disconnect(o.fed.cfg.listen)  # the HWMs apply from the next connection
        o.peer.connect(o.fed.cfg.listen)
        held = 0
        while held < 5000:  # nobody reads: how many does the owner's side take?
            try:
                o.peer.send_multipart([msgpack.packb(head(1)), b"x"], zmq.NOBLOCK)
            except zmq.Again:
                break
            held += 1
        limit = o.fed.cfg.queue_bytes // (1 << 20)  # max_frame 1 MiB: 64
        assert limit <= held <= limit + 2, held
    finally:
        o.close()


def hello_of(host: str) -> bytes:
    return wire.encode(Frame("hello", host, BOOT, 1, 1.0, {
        "agent_version": "t", "interval": 1.0, "collectors": {}, "nics": []}))


def test_a_peer_names_at_most_max_peer_hosts_hosts(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A compromised peer inventing host names: past `max_peer_hosts` names a forward naming
    a new one is rejected and counted, and never reaches diagnosis; the names it already
    holds still pass, and a name silent past `host_expire_s` frees its place."""
    o = Owner(tmp_path, max_peer_hosts=3)
    try:
        clock = [100.0]
        monkeypatch.setattr("c4.aggregator.federation.time.monotonic", lambda: clock[0])
        names = [f"invented{i}" for i in range(6)]
        for fseq, host in enumerate(names + ["invented0"], start=1):
            assert o.send(head(fseq), hello_of(host)) == [{"boot": BOOT, "fseq": fseq}]
            clock[0] += 1.0
        assert o.fed.rejected["too_many_hosts"] == 3 and o.fed.received == 4
        assert [f.host for f in o.applied] == names[:3] + ["invented0"]
        assert set(o.core.diagnosis.model.hosts) == set(names[:3])
        assert list(o.fed.named["b"]) == ["invented1", "invented2", "invented0"]
        # another peer has places of its own
        assert o.send(head(1, sender="c"), hello_of("other")) == [{"boot": BOOT, "fseq": 1}]
        assert o.fed.received == 5
        clock[0] += 61.0  # all of b's names silent past host_expire_s
        assert o.send(head(8), hello_of("invented5")) == [{"boot": BOOT, "fseq": 8}]
        assert list(o.fed.named["b"]) == ["invented5"] and o.fed.received == 6
        registry = CollectorRegistry()
        registry.register(FederationMetrics(o.fed))
        scrape = generate_latest(registry).decode()
        assert 'c4_federation_rejected_total{reason="too_many_hosts"} 3.0' in scrape
    finally:
        o.close()
