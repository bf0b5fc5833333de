"""The agent's measuring probe (agent/probe.py `Prober.measure`, a `probe` with `measure`): real
UDP sockets with IP_TTL and IP_RECVERR on loopback, where the destination itself answers
(port unreachable) as the hop at TTL 1; a router answers time-exceeded the same way."""
from __future__ import annotations

import socket

from c4.agent.probe import Prober, run_probe
from c4.core.wire.kinds import validate_body


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_measure_counts_answers_and_rtts():
    """Every datagram is answered by the hop at its TTL: sent = answered, RTTs reported, and
    the result is a valid probe_result entry."""
    closed = free_port()
    body = validate_body("probe", {"probe_id": "m1", "probes": [{
        "id": "leg", "proto": "roce", "dst": "127.0.0.1", "src": "127.0.0.1",
        "sports": [free_port()], "dport": closed, "measure": {"count": 40, "ttl": 1}}]})
    prober = Prober(rate=2000.0, burst=50.0)
    res = validate_body("probe_result", run_probe(prober, body))
    [entry] = res["results"]
    assert "error" not in entry, entry
    assert (entry["sent"], entry["answered"]) == (40, 40)
    assert entry["hops"] == ["127.0.0.1"]
    p50, p90, p99 = entry["rtt_us"]
    assert 0 < p50 <= p90 <= p99
    assert prober.packets == 41  # the first finds the hop, then `count`


def test_a_hop_that_does_not_answer_is_no_measurement():
    """A destination that swallows the datagrams (a listening socket, as a RoCE NIC consumes
    4791) never answers: no port reaches a hop, an error and nothing sent, not '100 % loss'."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sink:
        sink.bind(("127.0.0.1", 0))
        port = sink.getsockname()[1]
        m = Prober(rate=2000.0, burst=50.0).measure(
            "127.0.0.1", [free_port(), free_port()], ttl=1, count=20, dport=port,
            src="127.0.0.1", answer_timeout=0.05)
    assert m.sent == 0 and m.answered == 0 and m.hop is None
    assert m.error is not None and "no port of 2" in m.error


def test_only_the_expected_hop_counts():
    """`via` names the switch the leg must stop at: a port whose hop at the TTL is another
    one is skipped (in a fabric: its 5-tuple hashed onto another spine)."""
    closed = free_port()
    m = Prober(rate=2000.0, burst=50.0).measure(
        "127.0.0.1", [free_port()], ttl=1, count=5, dport=closed, src="127.0.0.1",
        via=("10.255.0.1",))
    assert m.sent == 0 and m.error is not None
