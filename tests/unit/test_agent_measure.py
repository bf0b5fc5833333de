"""The agent's measuring probe (agent/probe.py `Prober.measure`, a `probe` with `measure`): real
UDP sockets with IP_TTL and IP_RECVERR on loopback, where the destination itself answers
(port unreachable) as the hop at the TTL; a router answers time-exceeded the same way
(tests/root/test_measure_probe.py). And the aggregator's request and result around it."""
from __future__ import annotations

import socket
import threading
import time

from c4.agent.probe import Prober, ProbeWorker, TokenBucket, run_probe
from c4.aggregator.diagnosis.probes import AgentMeasurer, Leg
from c4.core.topology import Topology
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
    assert m.error is not None and "no port of 2" in m.error and m.elsewhere == 0


def test_only_the_expected_hop_counts():
    """`via` names the switch the leg must stop at: a port whose hop at the TTL is another
    one is skipped (in a fabric: its 5-tuple hashed onto another spine)."""
    closed = free_port()
    m = Prober(rate=2000.0, burst=50.0).measure(
        "127.0.0.1", [free_port()], ttl=1, count=5, dport=closed, src="127.0.0.1",
        via=("10.255.0.1",))
    assert m.sent == 0 and m.error is not None
    # the hop answered, from elsewhere: a leaf that no longer forwards to `via` (a silent
    # hop, above, is not counted)
    assert m.elsewhere == 1
    assert validate_body("probe_result", {"probe_id": "m", "results": [
        m.entry("leg", 1)]})["results"][0]["elsewhere"] == 1


def loopback_fabric() -> Topology:
    """node000 under leaf00, node001 under leaf01, one spine; every address is loopback, so
    the 'hop at TTL 2' that answers is the destination itself, from the spine's address."""
    topo = Topology.leaf_spine(2, 1, 2, 1)
    for h in topo.hosts.values():
        h.nics[0].addr = "127.0.0.1"
    topo.switches["spine00"].addrs = ["127.0.0.1"]
    return topo


def test_aggregator_request_round_trip():
    """C4D's side (aggregator/diagnosis/probes.py AgentMeasurer) asks the leg's source host,
    the agent measures with real sockets, its probe_result comes back as the leg's result."""
    m = AgentMeasurer(loopback_fabric())
    leg = Leg("node000/mlx5_0", "node001/mlx5_0", 2, "spine00")
    assert m.measure(leg, 30, 100.0)
    [(host, kind, body)] = m.take_outbox()
    assert (host, kind) == ("node000", "probe")
    probe = validate_body("probe", body)["probes"][0]
    assert probe["measure"] == {"count": 30, "ttl": 2, "via": ["127.0.0.1"]}
    assert len(set(probe["sports"])) == 32 and min(probe["sports"]) >= 0xC000
    out = validate_body("probe_result", run_probe(Prober(rate=2000.0, burst=50.0), body))
    m.on_result(host, out, 101.0)
    [(got, res)] = m.results(101.0)
    assert got == leg and (res.sent, res.answered, res.error) == (30, 30, None)
    assert res.rtt_p90_ms is not None and res.rtt_p90_ms > 0
    m.on_result(host, out, 102.0)  # answered once: a repeat is no second round
    assert m.results(102.0) == []


def test_no_request_without_the_spines_address():
    """Without an address to recognise the spine by, a port hashed onto another spine would
    be measured as if it crossed the candidate: nothing is asked."""
    topo = loopback_fabric()
    topo.switches["spine00"].addrs = []
    m = AgentMeasurer(topo)
    assert not m.measure(Leg("node000/mlx5_0", "node001/mlx5_0", 2, "spine00"), 30, 100.0)
    assert m.take_outbox() == []


def test_a_slow_hop_ends_the_round_on_time():
    """Lab run AA: a leg through a link at 10 Mbit/s answered in 38 ms (p90); each datagram
    waits for its answer, so 400 kept the agent's one prober busy 6-13 s and its other legs
    waited. A round now stops at 1.5 times what its pace takes (400 at 200/s: 3 s), reporting
    what it sent."""
    t = [0.0]

    def sleep(dt: float) -> None:
        t[0] += dt

    prober = Prober(rate=2000.0, burst=50.0, clock=lambda: t[0], sleep=sleep)

    def ping(s, dst, dport, seq, timeout):
        t[0] += 0.038  # the hop's answer, 38 ms later
        return ("127.0.0.1", 0.038)

    prober._ping = ping  # type: ignore[method-assign]
    m = prober.measure("127.0.0.1", [free_port()], ttl=2, count=400, dport=free_port(),
                       src="127.0.0.1")
    assert m.error is None and m.sent == m.answered
    assert 60 <= m.sent <= 80, m.sent  # 3 s of 38 ms answers
    assert t[0] <= 3.1


def test_lost_datagrams_waits_do_not_end_the_round():
    """CI: a leg losing a third of its datagrams waited 0.1 s for each and the round ended at
    93 of 300 sent; the loss is what the leg measures, so their waits do not count."""
    t = [0.0]

    def sleep(dt: float) -> None:
        t[0] += dt

    prober = Prober(rate=2000.0, burst=50.0, clock=lambda: t[0], sleep=sleep)

    def ping(s, dst, dport, seq, timeout):
        if seq % 3 == 1:  # lost: the whole answer timeout passes
            t[0] += timeout
            return None
        t[0] += 0.0002
        return ("127.0.0.1", 0.0002)

    prober._ping = ping  # type: ignore[method-assign]
    m = prober.measure("127.0.0.1", [free_port()], ttl=2, count=300, dport=free_port(),
                       src="127.0.0.1")
    assert m.error is None and m.sent == 300 and m.answered == 200


def test_a_slow_leg_does_not_hold_the_hosts_other_legs_back():
    """Lab run AB: one host's three legs ran in turn on one prober thread, so the slow leg's
    rounds came 7-8 s apart and its verdict waited for a third round. Legs now measure at
    once: a leg that finishes quickly is answered while a slow one is still under way."""
    release = threading.Event()

    class Slow(Prober):
        def measure(self, dst, sports, **kw):  # type: ignore[no-untyped-def,override]
            if dst == "127.0.0.2":
                release.wait(5)
            return super().measure(dst, sports, **kw)

    worker = ProbeWorker(Slow(rate=2000.0, burst=50.0))
    closed = free_port()

    def body(pid: str, dst: str) -> dict:
        return validate_body("probe", {"probe_id": pid, "probes": [{
            "id": "leg", "proto": "roce", "dst": dst, "src": "127.0.0.1",
            "sports": [free_port()], "dport": closed, "measure": {"count": 10, "ttl": 1}}]})

    try:
        worker.submit(body("slow", "127.0.0.2"))
        worker.submit(body("fast", "127.0.0.1"))
        deadline = time.monotonic() + 3
        got: list[dict] = []
        while not got and time.monotonic() < deadline:
            got = worker.results()
            time.sleep(0.01)
        assert [r["probe_id"] for r in got] == ["fast"]
        assert got[0]["results"][0]["answered"] == 10
        assert worker.pending()  # the slow leg is still measuring
    finally:
        release.set()
        worker.close()


def test_legs_measuring_at_once_take_different_ports():
    """Two legs of one source address offered the same ports: the kernel queues the answers of
    two sockets bound to one port on one of them, so the second leg takes the next port and
    each counts its own answers."""
    closed, ports = free_port(), [free_port(), free_port()]
    prober = Prober(rate=5000.0, burst=100.0)
    out: list = [None, None]
    start = threading.Barrier(2)

    def leg(i: int) -> None:
        start.wait()
        out[i] = prober.measure("127.0.0.1", ports, ttl=1, count=150, dport=closed,
                                src="127.0.0.1", pps=1000.0)

    threads = [threading.Thread(target=leg, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    a, b = out
    assert a.error is None and b.error is None, (a.error, b.error)
    assert {a.sport, b.sport} == set(ports)
    assert (a.sent, b.sent) == (a.answered, b.answered) == (150, 150)


def test_the_token_bucket_holds_its_rate_across_threads():
    """Traces and every leg share one bucket: four threads taking together get `rate` a
    second between them, not each."""
    bucket = TokenBucket(400.0, 1.0)
    t0 = time.monotonic()
    threads = [threading.Thread(target=lambda: [bucket.take() for _ in range(50)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert time.monotonic() - t0 >= 199 / 400
