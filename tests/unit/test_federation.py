"""Several aggregators (aggregator/federation.py): a job's owner by rendezvous hashing, its NCCL
summaries forwarded from the pod aggregators over real ZeroMQ with CURVE on loopback, owner-side
diagnosis, hostile and unknown peers, and a pod aggregator whose owner is down."""
from __future__ import annotations

import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from prometheus_client import generate_latest

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.federation import FederationConfig, owner
from c4.aggregator.server import Server
from c4.core import keys, wire
from c4.core.config import ConfigError, build
from c4.core.keys import ClientKeys
from c4.core.wire import Frame
from tests.e2e.procs import free_port, serving, wait_for
from tests.promtool import check_metrics
from tests.unit.test_diag_hang import comm_summary

PODS = ("pod-a", "pod-b")
GPUS = 2
HOSTS = {"h0": "pod-a", "h1": "pod-a", "h2": "pod-b", "h3": "pod-b"}
N = len(HOSTS) * GPUS
CULPRIT = 5  # rank 5 is on h2, in pod B
COMM = "00000000000000c4"
IVL = 0.5  # report interval: the hang is named after a few seconds


def job_owned_by(pod: str) -> str:
    return next(j for j in (f"job-{i}" for i in range(100)) if owner(j, PODS) == pod)


def host_of(r: int) -> str:
    return f"h{r // GPUS}"


# -- ownership --------------------------------------------------------------------------------

def test_ownership_is_stable_and_a_new_peer_takes_only_the_jobs_it_wins() -> None:
    jobs = [f"slurm-{i}" for i in range(2000)]
    three = ["a", "b", "c"]
    before = {j: owner(j, three) for j in jobs}
    assert before == {j: owner(j, list(reversed(three))) for j in jobs}  # order does not matter
    assert set(before.values()) == set(three)
    after = {j: owner(j, three + ["d"]) for j in jobs}
    moved = [j for j in jobs if after[j] != before[j]]
    assert moved and all(after[j] == "d" for j in moved)  # nothing moves between old peers
    assert 0.15 < len(moved) / len(jobs) < 0.35  # about a quarter: d's share


def test_config_is_off_by_default_and_checked() -> None:
    assert not build(FederationConfig, {}, "federation").enabled
    assert not AggregatorConfig().federation
    peers = [{"name": "a", "endpoint": "tcp://10.0.0.1:9466"},
             {"name": "b", "endpoint": "tcp://10.0.0.2:9466"}]
    assert build(FederationConfig, {"name": "a", "peers": peers}, "federation").enabled
    with pytest.raises(ConfigError, match="must be one of peers"):
        build(FederationConfig, {"name": "c", "peers": peers}, "federation")
    with pytest.raises(ConfigError, match="unique"):
        build(FederationConfig, {"name": "a", "peers": peers + peers[:1]}, "federation")
    with pytest.raises(ConfigError, match="not a Z85"):
        build(FederationConfig, {"name": "a", "peers": [
            {**peers[0], "public_key": "~" * 40}, peers[1]]}, "federation")
    with pytest.raises(ConfigError, match="unknown key"):
        build(FederationConfig, {"name": "a", "peers": peers, "owner": "a"}, "federation")


# -- real aggregators on loopback ---------------------------------------------------------------

class Cluster:
    """Aggregators (CURVE, each with its own agents' keys enrolled) and the agents' sockets."""

    def __init__(self, tmp: Path, stack: ExitStack, running: tuple[str, ...] = PODS,
                 **fed: Any) -> None:
        self.tmp = tmp
        self.stack = stack
        self.pub = {p: keys.load_public(keys.create_pair(tmp / p, "server")[0]) for p in PODS}
        self.fed_port = {p: free_port() for p in PODS}
        self.fed = fed
        self.servers: dict[str, Server] = {}
        for pod in running:
            self.start(pod)
        self.agents: dict[str, zmq.Socket] = {}
        self.seq = {h: 0 for h in HOSTS}

    def cfg(self, pod: str) -> AggregatorConfig:
        peers = [{"name": p, "endpoint": f"tcp://127.0.0.1:{self.fed_port[p]}",
                  "public_key": self.pub[p].decode()} for p in PODS]
        return AggregatorConfig(
            name=pod, listen=f"tcp://127.0.0.1:{free_port()}", api="127.0.0.1:0",
            db=self.tmp / f"{pod}.db", server_secret_key=str(self.tmp / pod / "server.key_secret"),
            enrolled_keys=str(self.tmp / pod / "enrolled"),
            diagnosis={"hang_floor_s": 3.0, "checkpoint_s": 0.0, "startup_grace_s": 0.0},
            federation={"name": pod, "listen": f"tcp://127.0.0.1:{self.fed_port[pod]}",
                        "peers": peers, **self.fed})

    def start(self, pod: str) -> Server:
        for h, p in HOSTS.items():
            if p == pod and not (self.tmp / pod / f"{h}.key").exists():
                pub, _ = keys.create_pair(self.tmp / pod, h)
                keys.enroll(self.tmp / pod / "enrolled", h, keys.load_public(pub))
        srv = self.servers[pod] = self.stack.enter_context(serving(Server(self.cfg(pod))))
        return srv

    def agent(self, host: str) -> zmq.Socket:
        s = self.agents.get(host)
        if s is None:
            pod = HOSTS[host]
            s = self.agents[host] = zmq.Context.instance().socket(zmq.DEALER)
            self.stack.callback(s.close, 0)
            s.setsockopt(zmq.LINGER, 0)
            ClientKeys.load(self.tmp / pod / "server.key",
                            self.tmp / pod / f"{host}.key_secret").apply(s)
            s.connect(self.servers[pod].cfg.listen)
        return s

    def send(self, host: str, kind: str, body: dict[str, Any]) -> int:
        self.seq[host] += 1
        self.agent(host).send(wire.encode(Frame(kind, host, "b00t", self.seq[host], time.time(),
                                                body)))
        return self.seq[host]

    def acked(self, host: str) -> int:
        """The highest seq the host's aggregator acked so far (reads its replies)."""
        s, best = self.agent(host), 0
        while s.poll(0):
            f = wire.decode(s.recv())
            if f.kind == "ack":
                best = max(best, f.body["seq"])
        return best

    def hello(self) -> None:
        for h in HOSTS:
            self.send(h, "hello", {"agent_version": "t", "interval": IVL, "collectors": {},
                                   "nics": []})

    def report(self, job: str, summaries: dict[int, dict[str, Any]]) -> None:
        for h in HOSTS:
            comms = [s for r, s in sorted(summaries.items()) if host_of(r) == h]
            self.send(h, "report", {"interval": IVL, "health": {}, "nccl": {"comms": comms}})

    def stats(self, pod: str) -> dict[str, Any]:
        return self.servers[pod].api.stats()

    def incidents(self, pod: str) -> list[dict[str, Any]]:
        return self.servers[pod].core.diagnosis.incidents()


def summary(job: str, r: int, started: int, completed: int, ops: int = 0,
            age: float | None = None) -> dict[str, Any]:
    return comm_summary(COMM, job, N, GPUS, r, started, completed, ops, age)


def test_a_hung_rank_in_pod_b_is_named_by_the_jobs_owner_in_pod_a(tmp_path: Path) -> None:
    job = job_owned_by("pod-a")
    with ExitStack() as stack:
        c = Cluster(tmp_path, stack)
        c.hello()
        done, ops = 0, 5
        for _ in range(8):  # healthy: every rank completes `ops` collectives per interval
            done += ops
            c.report(job, {r: summary(job, r, done, done, ops) for r in range(N)})
            time.sleep(IVL)
        for k in range(1, 30):  # every rank but CULPRIT enters ordinal `done`; it never does
            age = k * IVL
            out = {r: summary(job, r, done + 1, done, age=age) for r in range(N)}
            out[CULPRIT] = summary(job, CULPRIT, done, done)
            c.report(job, out)
            if c.incidents("pod-a"):
                break
            time.sleep(IVL)
        incs = wait_for(lambda: c.incidents("pod-a"), 5, "an incident on the owner")
        (inc,) = incs
        assert inc["class"] == "noncomm_hang" and inc["job"] == job, inc
        assert inc["suspects"][0]["id"] == "h2", inc  # a host of pod B, named in pod A
        assert CULPRIT in inc["evidence"]["culprit_ranks"]
        # the owner learnt pod B's hosts from their hellos, forwarded before their first summary
        assert c.servers["pod-a"].core.diagnosis.model.hosts["h2"].interval == IVL
        # pod B stored and acked its frames, diagnosed none of the job, forwarded it all
        assert not c.incidents("pod-b")
        assert not c.servers["pod-b"].core.diagnosis.model.comms
        reports = 2 * (c.seq["h0"] - 1)
        wait_for(lambda: c.stats("pod-b")["accepted"]["report"] == reports, 5, "B's reports")
        assert not any(c.stats("pod-b")["rejected"].values())
        wait_for(lambda: c.stats("pod-b")["federation"]["out"]["pod-a"]["queued"] == 0, 5,
                 "pod B's forwards acked")
        out = c.stats("pod-b")["federation"]["out"]["pod-a"]
        assert out["forwarded"] == out["acked"] >= reports
        assert out["dropped"] == 0
        a = c.stats("pod-a")["federation"]["in"]
        assert a["received"] == out["forwarded"] and not any(a["rejected"].values())
        assert a["lost"] == {"pod-b": 0} and a["silent_s"]["pod-b"] is not None
        # pod A's own hosts' frames never left it: it owns the job
        assert c.stats("pod-a")["federation"]["out"]["pod-b"]["forwarded"] == 0


def _forward(sock: zmq.Socket, fseq: int, frame: Frame, sender: str = "pod-b",
             boot: str = "0123456789abcdef") -> None:
    head = msgpack.packb({"from": sender, "boot": boot, "fseq": fseq, "floor": 1})
    sock.send_multipart([head, wire.encode(frame, validate=False)])


def test_forwards_from_unknown_keys_and_bad_forwards_from_a_peer_are_rejected_and_counted(
        tmp_path: Path) -> None:
    mine, theirs = job_owned_by("pod-a"), job_owned_by("pod-b")
    with ExitStack() as stack:
        c = Cluster(tmp_path, stack, running=("pod-a",))
        a = c.servers["pod-a"]
        endpoint = f"tcp://127.0.0.1:{c.fed_port['pod-a']}"
        # an unknown key: refused at the handshake by the peers' ZAP handler, nothing applied
        stranger = stack.enter_context(zmq.Context.instance().socket(zmq.DEALER))
        stranger.setsockopt(zmq.LINGER, 0)
        stranger.curve_serverkey = c.pub["pod-a"]
        stranger.curve_publickey, stranger.curve_secretkey = zmq.curve_keypair()
        stranger.connect(endpoint)
        good = Frame("report", "h3", "b00t", 1, 1.0, {"interval": IVL, "health": {}, "nccl": {
            "comms": [summary(mine, 6, 5, 5, 5)]}})  # valid, but from the wrong senders below
        _forward(stranger, 1, good)
        wait_for(lambda: c.stats("pod-a")["federation"]["in"]["auth"]["denied"]["unenrolled"],
                 5, "the unknown key refused")
        peer_sock = stack.enter_context(zmq.Context.instance().socket(zmq.DEALER))
        peer_sock.setsockopt(zmq.LINGER, 0)
        ClientKeys(c.pub["pod-a"], *keys.load_secret(tmp_path / "pod-b" / "server.key_secret")
                   ).apply(peer_sock)
        peer_sock.connect(endpoint)
        bad = [
            Frame("report", "h2", "b00t", 2, 1.0, {"interval": IVL, "health": {}, "nccl": {
                "comms": [summary(theirs, 4, 5, 5, 5)]}}),  # pod B's own job: not_owner
            Frame("report", "h2", "b00t", 3, 1.0, {"interval": IVL, "health": {},
                                                   "rdma": {"ports": []}}),  # host-level
            Frame("event", "h2", "b00t", 4, 1.0, {"type": "xid", "severity": "error", "attrs": {
                "code": 79, "pci": "0000:3b:00", "pid": None, "process": None,
                "text": "NVRM: Xid (PCI:0000:3b:00): 79"}}),  # host-level: not nccl_stall
            Frame("report", "h2", "b00t", 5, 1.0, {"interval": -1.0, "health": {}}),  # schema
            Frame("report", "h2", "b00t", 6, 1.0, {"interval": IVL, "health": {}, "nccl": {
                "comms": [summary(mine, 4, 5, 5, 5)]}}),  # fine
        ]
        for i, f in enumerate(bad, start=1):
            _forward(peer_sock, i, f)
        peer_sock.send_multipart([b"\xc1", b"x"])  # not msgpack: malformed header
        _forward(peer_sock, 7, good, sender="pod-a")  # pod B's key naming another peer
        st = wait_for(lambda: (lambda s: s if s["received"] + sum(s["rejected"].values()) >= 7
                               else None)(c.stats("pod-a")["federation"]["in"]), 5,
                      "the forwards handled")
        assert st["rejected"] == {"malformed": 1, "identity": 1, "not_owner": 1,
                                  "unexpected_section": 1, "unexpected_kind": 1, "bad_frame": 1,
                                  "too_many_hosts": 0}
        assert st["received"] == 1
        # the one good forward reached diagnosis as from h2; the stranger's (rank 6) never did
        comm = a.core.diagnosis.model.comms[COMM]
        assert set(comm.ranks) == {4} and comm.ranks[4].host == "h2"


def test_the_owner_down_costs_pod_b_dropped_forwards_not_ingest(tmp_path: Path) -> None:
    job = job_owned_by("pod-a")
    with ExitStack() as stack:
        c = Cluster(tmp_path, stack, running=("pod-b",), queue_bytes=64 << 10)
        c.send("h2", "hello", {"agent_version": "t", "interval": IVL, "collectors": {},
                               "nics": []})
        big = [dict(summary(job, r, 9, 9, 5), peers=[
            {"peer": p, "channel": ch, "dir": "send", "bytes": 1 << 20, "steps": 8,
             "net_wait_s": 0.01} for p in range(N) for ch in range(8)]) for r in (4, 5)]
        for _ in range(60):
            last = c.send("h2", "report", {"interval": IVL, "health": {},
                                           "nccl": {"comms": big}})
        # pod B acks everything its agent sent: ingest never waits for the owner
        wait_for(lambda: c.acked("h2") >= last, 10, "every report acked by pod B")
        out = wait_for(lambda: (lambda o: o if o["forwarded"] == 61 else None)(
            c.stats("pod-b")["federation"]["out"]["pod-a"]), 5, "all forwards queued")
        assert out["dropped"] > 0 and out["queued_bytes"] <= 64 << 10
        assert out["forwarded"] == out["dropped"] + out["queued"] and out["acked"] == 0
        assert c.stats("pod-b")["accepted"]["report"] == 60
        assert c.stats("pod-b")["federation"]["in"]["silent_s"] == {"pod-a": None}
        scrape = generate_latest(c.servers["pod-b"].api.metrics).decode()
        assert f'c4_federation_dropped_total{{peer="pod-a"}} {out["dropped"]}.0' in scrape
        if shutil.which("promtool"):  # lints clean (the test above must not skip without it)
            check_metrics(scrape)
        # the owner comes up: what is still queued is delivered, the rest stays counted
        c.start("pod-a")
        final = wait_for(lambda: (lambda o: o if o["queued"] == 0 else None)(
            c.stats("pod-b")["federation"]["out"]["pod-a"]), 15, "the queue delivered")
        assert final["acked"] + final["dropped"] == final["forwarded"]
        comm = wait_for(lambda: c.servers["pod-a"].core.diagnosis.model.comms.get(COMM), 5,
                        "the owner's model")
        assert {r.host for r in comm.ranks.values()} == {"h2"}


def test_the_owner_applies_each_peer_stream_in_order_once(tmp_path: Path) -> None:
    """A gap (a forward lost in flight) holds the later ones back until the sender goes back
    and resends from it; a resend of what was applied is a duplicate, not a second report."""
    job = job_owned_by("pod-a")
    with ExitStack() as stack:
        c = Cluster(tmp_path, stack, running=("pod-a",))
        a = c.servers["pod-a"]
        peer = stack.enter_context(zmq.Context.instance().socket(zmq.DEALER))
        peer.setsockopt(zmq.LINGER, 0)
        ClientKeys(c.pub["pod-a"], *keys.load_secret(tmp_path / "pod-b" / "server.key_secret")
                   ).apply(peer)
        peer.connect(f"tcp://127.0.0.1:{c.fed_port['pod-a']}")

        def report(seq: int) -> Frame:  # rank 4 on h2 has completed `seq` collectives
            return Frame("report", "h2", "b00t", seq, 1.0, {"interval": IVL, "health": {},
                                                            "nccl": {"comms": [summary(
                                                                job, 4, seq, seq, 1)]}})

        def acked() -> int:
            best = 0
            while peer.poll(200):
                best = max(best, msgpack.unpackb(peer.recv())["fseq"])
            return best

        completed = lambda: a.core.diagnosis.model.comms[COMM].ranks[4].seq_completed  # noqa: E731
        _forward(peer, 1, report(1))
        _forward(peer, 3, report(3))  # 2 was lost: 3 waits
        assert wait_for(acked, 5, "ack") == 1
        assert completed() == 1
        for fseq in (1, 2, 3):  # the sender goes back to the oldest unacked (1 is a resend)
            _forward(peer, fseq, report(fseq))
        assert wait_for(acked, 5, "ack") == 3
        assert completed() == 3
        st = c.stats("pod-a")["federation"]["in"]
        assert st["received"] == 3 and st["duplicates"] == 1


def test_the_sender_resends_what_was_not_acked_in_order(tmp_path: Path) -> None:
    """Pod B's side against a stand-in owner that loses the first forward it gets: after
    resend_after the link goes back and sends it again, followed by the rest, in order."""
    from c4.aggregator.federation import Federation
    from c4.aggregator.state import HostRegistry

    job = job_owned_by("pod-a")
    owner_port = free_port()
    cfg = build(FederationConfig, {
        "name": "pod-b", "listen": f"tcp://127.0.0.1:{free_port()}", "resend_after": 1.0,
        "peers": [{"name": "pod-a", "endpoint": f"tcp://127.0.0.1:{owner_port}"},
                  {"name": "pod-b", "endpoint": "tcp://127.0.0.1:1"}]}, "federation")
    with ExitStack() as stack:
        stand_in = stack.enter_context(zmq.Context.instance().socket(zmq.ROUTER))
        stand_in.setsockopt(zmq.LINGER, 0)
        stand_in.bind(f"tcp://127.0.0.1:{owner_port}")
        fed = Federation(cfg, "0123456789abcdef", None, 1 << 20, lambda d: wire.decode(d),
                         HostRegistry())
        stack.callback(fed.close)
        for seq in (1, 2, 3):
            local = fed.local(Frame("report", "h2", "b00t", seq, 1.0, {
                "interval": IVL, "health": {}, "nccl": {"comms": [summary(job, 4, seq, seq)]}}),
                10.0)
            assert local is not None and local.body["nccl"]["comms"] == []  # not diagnosed here

        rids: list[bytes] = []

        def got(now: float, wait: float = 5.0) -> list[int]:
            out: list[int] = []
            deadline = time.monotonic() + wait
            while not out and time.monotonic() < deadline:
                fed.pump(now)
                while stand_in.poll(100):
                    rid, head, _ = stand_in.recv_multipart()
                    rids.append(rid)
                    out.append(msgpack.unpackb(head)["fseq"])
            return out

        assert got(10.0) == [1, 2, 3]  # lost by the stand-in: no ack
        assert got(10.5, wait=0.5) == []  # within resend_after: nothing again
        assert got(11.5) == [1, 2, 3]  # went back to the oldest unacked
        stand_in.send_multipart([rids[-1], msgpack.packb({"boot": "0123456789abcdef",
                                                          "fseq": 2})])
        wait_for(lambda: (fed.pump(12.0), fed.links["pod-a"].acked == 2)[1], 5, "the ack")
        assert [f for f, _ in fed.links["pod-a"].queue] == [3]
        assert fed.stats()["out"]["pod-a"]["resent"] == 3
