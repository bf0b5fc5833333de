"""The agent's sender against a real ZeroMQ ROUTER driving the real ingest (in-process)."""
from __future__ import annotations

import zmq

from c4.agent.sender import Sender
from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect
from c4.core import wire


class Router:
    """The aggregator's receive/ack loop, reduced to what the sender sees."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.bind(endpoint)
        self.ingest = Ingest(Store(connect(":memory:")), HostRegistry(), None)

    def pump(self) -> None:
        while self.sock.poll(50):
            peer, data = self.sock.recv_multipart()
            for reply in self.ingest.handle(data, 1.0).replies:
                self.sock.send_multipart([peer, wire.encode(reply)])
            for _, ack in self.ingest.take_acks(1.0):
                self.sock.send_multipart([peer, wire.encode(ack)])


def _report(interval: float = 1.0) -> dict:
    return {"interval": interval, "health": {}}


def test_acked_frames_leave_the_queue() -> None:
    ctx = zmq.Context()
    router = Router(ctx, "inproc://acks")
    s = Sender("inproc://acks", "h1", ctx=ctx)
    try:
        for _ in range(5):
            s.send("report", _report())
        for _ in range(20):
            router.pump()
            s.poll(0.02)
            if not s.unacked:
                break
        assert s.unacked == 0 and s.stats.acked == 5
        assert router.ingest.registry.hosts["h1"].seqs[s.boot].contiguous == 5
    finally:
        s.close()
        router.sock.close(0)
        ctx.term()


def test_a_rejected_frame_is_dropped_not_resent_forever() -> None:
    ctx = zmq.Context()
    router = Router(ctx, "inproc://reject")
    # Sampled self-validation lets a bad body out; the aggregator must reject it and the
    # sender must stop holding it, or the ack would never move past it again.
    s = Sender("inproc://reject", "h1", ctx=ctx, validate_every=1000, resend_after=0.5)
    try:
        s.send("report", _report())          # validated (first of its kind)
        s.send("report", _report(-5.0))      # not validated, invalid
        s.send("report", _report())
        for _ in range(10):
            router.pump()
            s.poll(0.02)
        assert s.stats.errors_received >= 1 and "bad_body" in s.stats.last_error
        # The next frame carries the new floor (the oldest frame still held): the aggregator
        # stops waiting for the rejected one and counts it lost.
        s.send("report", _report())
        for _ in range(40):
            router.pump()
            s.poll(0.02)
            if not s.unacked:
                break
        assert s.unacked == 0
        seqs = router.ingest.registry.hosts["h1"].seqs[s.boot]
        assert seqs.contiguous == 4 and seqs.lost == 1
        assert router.ingest.rejected["bad_body"] >= 1
    finally:
        s.close()
        router.sock.close(0)
        ctx.term()


def test_full_queue_drops_oldest_and_tells_the_floor() -> None:
    ctx = zmq.Context()
    s = Sender("inproc://nobody", "h1", ctx=ctx, queue_max=10)  # no aggregator at all
    try:
        for _ in range(25):
            s.send("report", _report())
        assert s.unacked == 10 and s.stats.dropped_queue_full == 15
        assert s._floor(26) == 16  # the oldest frame still held
    finally:
        s.close()
        ctx.term()
