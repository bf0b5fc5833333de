"""The agent's measuring probe (agent/probe.py `Prober.measure`, a `probe` with `measure`): real
UDP sockets with IP_TTL and IP_RECVERR on loopback, where the destination itself answers
(port unreachable) as the hop at the TTL; a router answers time-exceeded the same way
(tests/root/test_measure_probe.py). And the aggregator's request and result around it."""
from __future__ import annotations

import socket
import threading
import time

from c4.agent.probe import Measurement, Prober, ProbeWorker, TokenBucket, run_probe
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


class Hop:
    """A simulated hop for `Prober.measure` on a simulated clock: each datagram's answer comes
    `rtt` s after it was sent, or never (`lost(seq)`), quoting the datagram (`quote`) or too
    little of it to name its seq."""

    def __init__(self, rtt: float, lost=lambda seq: False, quote: bool = True) -> None:
        self.t, self.rtt, self.lost, self.quote = 0.0, rtt, lost, quote
        self.due: list[tuple[float, int]] = []
        self.sends: list[float] = []

    def prober(self) -> Prober:
        def sleep(dt: float) -> None:
            self.t += dt

        p = Prober(rate=2000.0, burst=50.0, clock=lambda: self.t, sleep=sleep)
        p._ping = self.ping  # type: ignore[method-assign]
        p._send = self.send  # type: ignore[method-assign]
        p._heard = self.heard  # type: ignore[method-assign]
        return p

    def ping(self, s, dst, dport, seq, timeout):  # the first datagram: the hop is there
        self.t += self.rtt
        return ("127.0.0.1", self.rtt)

    def send(self, s, dst, dport, seq) -> None:
        self.sends.append(self.t)
        if not self.lost(seq):
            self.due.append((self.t + self.rtt, seq))

    def heard(self, s, timeout):
        until = self.t + timeout
        ready = [(at, q) for at, q in self.due if at <= until]
        self.t = min([until] + [at for at, _ in ready])
        out = [(q if self.quote else None, "127.0.0.1") for at, q in self.due if at <= self.t]
        self.due = [(at, q) for at, q in self.due if at > self.t]
        return out


def measure(hop: Hop, count: int) -> Measurement:
    return hop.prober().measure("127.0.0.1", [free_port()], ttl=2, count=count,
                                dport=free_port(), src="127.0.0.1")


def test_a_slow_hop_does_not_slow_the_round():
    """Lab run AA: a leg through a link at 10 Mbit/s answered in 38 ms (p90); each datagram
    waited for its answer, so 400 kept the agent's prober busy 6-13 s (then, cut at 1.5x the
    pace, 60-80 were sent). Datagrams now go at the pace, answers matched as they come."""
    hop = Hop(0.038)
    m = measure(hop, 400)
    assert m.error is None and (m.sent, m.answered) == (400, 400)
    assert hop.t <= 400 / 200 + 0.038 + 0.05  # the pace, then the last answer
    assert all(abs(r - 0.038) < 1e-6 for r in m.rtts)


def test_a_lossy_hop_does_not_slow_the_round():
    """Lab run AD: a leg losing 10 % waited 0.1 s for each lost datagram, so its rounds took
    6 s and came 6-7 s apart; loss named 30.5 s after the fault, waiting for a round 8 s
    after the first lossy one. A lost datagram now costs nothing but its place in the pace
    (and CI, before: cut at 1.5x the pace with lost waits counted, 93 of 300 were sent)."""
    hop = Hop(0.0002, lost=lambda seq: seq % 3 == 1)
    m = measure(hop, 300)
    assert m.error is None and (m.sent, m.answered) == (300, 200)
    assert hop.t <= 300 / 200 + 0.1 + 0.05  # the pace, then the last one's timeout
    assert len(m.rtts) == 200 and max(m.rtts) < 0.001


def test_answers_that_do_not_name_their_datagram_are_taken_in_order():
    """A router that quotes only the UDP header gives no seq: an answer goes to the oldest
    datagram still waiting (answers come back in order), so RTTs stay right."""
    hop = Hop(0.012, quote=False)
    m = measure(hop, 100)
    assert (m.sent, m.answered) == (100, 100)
    assert all(abs(r - 0.012) < 1e-6 for r in m.rtts)


def test_the_pace_holds_without_answers_to_wait_for():
    """Sending does not wait for answers, so the pace is what keeps a leg within a switch's
    ICMP policer: 200 a second, not faster."""
    hop = Hop(0.0002)
    measure(hop, 200)
    gaps = [b - a for a, b in zip(hop.sends, hop.sends[1:])]
    assert min(gaps) >= 1 / 200 - 1e-9


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


def test_measure_over_ipv6():
    """The same round on IPv6 loopback: ICMPv6 port unreachable answers through
    IPV6_RECVERR, each matched to its datagram while the next ones are already sent."""
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind(("::1", 0))
        closed = s.getsockname()[1]
    with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
        s.bind(("::1", 0))
        sport = s.getsockname()[1]
    m = Prober(rate=5000.0, burst=100.0).measure("::1", [sport], ttl=1, count=100,
                                                 dport=closed, src="::1", pps=1000.0)
    assert m.error is None and (m.sent, m.answered) == (100, 100)
    assert m.hop == "::1" and len(m.rtts) == 100
