"""The verbs path-control library (plugin/pathctl/libc4-pathctl.so) in a real process, fed by the
agent's real plan application (c4.agent.pathctl) over its Unix socket, with the verbs test
library (tests/verbs) standing in for libibverbs and libmlx5: it records every attribute that
reaches ibv_modify_qp and every mlx5dv_modify_qp_udp_sport call, so each test checks what the
"NIC" was told, on which QP, and what plan_result said about it."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from c4.agent.pathctl import PathControl
from c4.core.roce import sport_for_qp
from c4.core.wire.kinds import BODIES
from tests.verbs import harness

PATHCTL = harness.VERBS_DIR.parent.parent / "plugin" / "pathctl"
TESTLIB = str(harness.LIBRARY)
ROCE_V2_DEV, ROCE_V1_DEV = "c4test_1", "c4test_0"  # gid index 3 of each, by the sysfs fixture


def _runtime(name: str) -> str:
    """The sanitizer runtime (libasan.so, libtsan.so) that goes first in LD_PRELOAD."""
    out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
    return out.stdout.strip()


@pytest.fixture(scope="module")
def built() -> None:
    harness.require()
    proc = subprocess.run(["make", "-j1", "-C", str(PATHCTL), "all", "asan", "tsan", "exports"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[PathControl]:
    pc = PathControl(tmp_path / "run", deadline=3.0)
    pc.start()
    try:
        yield pc
    finally:
        pc.close()


class App:
    """qp_driver with the path-control library in front of the test verbs library."""

    def __init__(self, tmp: Path, agent: PathControl, route: str, *,
                 extra_env: dict[str, str] | None = None) -> None:
        sysfs = tmp / "sys"
        for dev, kind in ((ROCE_V2_DEV, "RoCE v2"), (ROCE_V1_DEV, "IB/RoCE v1")):
            types = sysfs / "class/infiniband" / dev / "ports/1/gid_attrs/types"
            types.mkdir(parents=True, exist_ok=True)
            (types / "3").write_text(kind + "\n")
        self.log = tmp / f"verbs-{route}.jsonl"
        build = PATHCTL / "build"
        env = dict(os.environ, C4_PATHCTL_IBVERBS=TESTLIB, C4_PATHCTL_MLX5=TESTLIB,
                   C4_PATHCTL_SOCKET=str(agent.path), C4TEST_VERBS_LOG=str(self.log),
                   C4TEST_SYSFS=str(sysfs), **(extra_env or {}))
        args: tuple[str, ...] = ()
        if route == "preload":  # an application linked against libibverbs
            env["LD_PRELOAD"] = str(build / "libc4-pathctl.so")
        elif route == "asan":  # the same under AddressSanitizer + UBSan
            env["LD_PRELOAD"] = f"{_runtime('libasan.so')}:{build / 'asan/libc4-pathctl.so'}"
            env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=1"
            env["UBSAN_OPTIONS"] = "print_stacktrace=1:halt_on_error=1"
        elif route == "tsan":  # the agent thread against the verbs calls, under ThreadSanitizer
            env["LD_PRELOAD"] = f"{_runtime('libtsan.so')}:{build / 'tsan/libc4-pathctl.so'}"
            env["TSAN_OPTIONS"] = "halt_on_error=1:exitcode=66"
        elif route == "nccl_ibverbs_lib":  # NCCL 2.30+: NCCL_IBVERBS_LIB=<path>
            args = ("--dlopen", str(build / "libc4-pathctl.so"))
        elif route == "ld_library_path":  # older NCCL: dlopen("libibverbs.so") finds ours
            env["LD_LIBRARY_PATH"] = str(build / "nccl")
            args = ("--dlopen", "libibverbs.so")
        self.d = harness.Driver(*args, env=env)
        self.agent = agent

    def connect(self, qpn: int, dev: str = ROCE_V2_DEV) -> None:
        """Open `dev` and make the first QP, which starts the library's agent thread."""
        self.d.ok(f"open {dev[-1]}")
        self.d.ok(f"create {qpn:#x} RC")
        deadline = time.monotonic() + 10
        while self.d.pid not in self.agent.connected_pids():
            assert time.monotonic() < deadline, "the library never connected to the agent"
            time.sleep(0.02)

    def to_rts(self, qpn: int, rqpn: int) -> None:
        self.d.ok(f"modify {qpn:#x} INIT")
        self.d.ok(f"modify {qpn:#x} RTR {rqpn:#x} 0 10.0.0.2")
        self.d.ok(f"modify {qpn:#x} RTS")

    def calls(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def close(self) -> None:
        assert self.d.close() == 0


def plan(pc: PathControl, *assignments: dict[str, Any], plan_id: str = "p1",
         timeout: float = 10) -> dict[str, Any]:
    body = {"plan_id": plan_id, "assignments": list(assignments)}
    BODIES["plan"].check(body, "body")
    pc.submit(body)
    deadline = time.monotonic() + timeout
    while True:
        out = pc.results()
        if out:
            assert len(out) == 1
            BODIES["plan_result"].check(out[0], "body")
            return out[0]
        assert time.monotonic() < deadline
        time.sleep(0.01)


def roce(aid: str, qpn: int, sport: int, pid: int | None, dev: str = ROCE_V2_DEV) -> dict[str, Any]:
    a: dict[str, Any] = {"id": aid, "proto": "roce", "sport": sport, "lqpn": qpn, "dev": dev}
    if pid is not None:
        a["pid"] = pid
    return a


@pytest.mark.parametrize("route", ["preload", "asan", "tsan", "nccl_ibverbs_lib",
                                   "ld_library_path"])
def test_live_replan_reaches_the_rts_qp(built: None, agent: PathControl, tmp_path: Path,
                                        route: str) -> None:
    app = App(tmp_path, agent, route)
    try:
        app.connect(0x200)
        app.d.ok("create 0x201 RC")
        for q in (0x200, 0x201):
            app.to_rts(q, q + 0x100)
        r = plan(agent, roce("a", 0x201, 4242, app.d.pid))
        assert r["applied"] == [{"id": "a", "sport": 4242}] and r["failed"] == []
        # a re-plan moves the same live QP again
        r = plan(agent, roce("a", 0x201, 51000, app.d.pid), plan_id="p2")
        assert r["applied"] == [{"id": "a", "sport": 51000}]
        sports = [(c["qpn"], c["sport"]) for c in app.calls() if c["call"] == "udp_sport"]
        assert sports == [(0x201, 4242), (0x201, 51000)]  # only the planned QP, nothing else
    finally:
        app.close()


@pytest.mark.parametrize("route", ["preload", "tsan"])  # tsan: results queued by the app thread
def test_flow_label_at_rtr_gives_the_planned_port(built: None, agent: PathControl,
                                                  tmp_path: Path, route: str) -> None:
    app = App(tmp_path, agent, route)
    try:
        app.connect(0x300)
        app.d.ok("modify 0x300 INIT")
        sport = 0xD123
        agent.submit({"plan_id": "early", "assignments": [roce("e", 0x300, sport, app.d.pid)]})
        time.sleep(0.2)  # the library holds it until the QP's INIT->RTR
        assert agent.results() == []
        app.d.ok("modify 0x300 RTR 0x777 0 10.0.0.2")  # the application asks for label 0
        app.d.ok("modify 0x300 RTS")
        r = plan_wait(agent)
        assert r["applied"] == [{"id": "e", "sport": sport}]
        rtr = [c for c in app.calls() if c["call"] == "modify" and c["state"] == 2]
        assert len(rtr) == 1 and rtr[0]["qpn"] == 0x300
        # the kernel's own formula turns what the NIC got into the planned port
        assert rtr[0]["flow_label"] != 0
        assert sport_for_qp(0x300, 0x777, rtr[0]["flow_label"]) == sport
        assert not [c for c in app.calls() if c["call"] == "udp_sport"]
    finally:
        app.close()


def plan_wait(pc: PathControl, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = pc.results()
        if out:
            return out[0]
        time.sleep(0.01)
    raise AssertionError("no plan_result")


@pytest.mark.parametrize("dev,sport", [(ROCE_V2_DEV, 4000), (ROCE_V1_DEV, 0xE000)])
def test_port_the_label_cannot_give_is_set_right_after_rts(built: None, agent: PathControl,
                                                           tmp_path: Path, dev: str,
                                                           sport: int) -> None:
    """Below 0xC000 no flow label maps to the port, and a non-RoCEv2 GID has no label-derived
    port: both are set by mlx5dv_modify_qp_udp_sport as the QP enters RTS."""
    app = App(tmp_path, agent, "preload")
    try:
        app.connect(0x400, dev)
        app.d.ok("modify 0x400 INIT")
        agent.submit({"plan_id": "p", "assignments": [roce("x", 0x400, sport, app.d.pid, dev)]})
        time.sleep(0.1)
        app.d.ok("modify 0x400 RTR 0x500 0 10.0.0.2")
        app.d.ok("modify 0x400 RTS")
        r = plan_wait(agent)
        assert r["applied"] == [{"id": "x", "sport": sport}], r
        calls = app.calls()
        rtr = [c for c in calls if c["call"] == "modify" and c["state"] == 2]
        assert rtr[0]["flow_label"] == 0  # left as the application set it
        # the port change follows the RTS transition directly
        assert calls[-1] == {"call": "udp_sport", "qpn": 0x400, "sport": sport, "rc": 0}
        assert calls[-2]["call"] == "modify" and calls[-2]["state"] == 3
    finally:
        app.close()


def test_failures_come_back_as_plan_result(built: None, agent: PathControl,
                                           tmp_path: Path) -> None:
    app = App(tmp_path, agent, "preload", extra_env={"C4TEST_UDP_SPORT_ERRNO": "95"})
    try:
        app.connect(0x600)
        app.to_rts(0x600, 0x601)
        app.d.ok("create 0x610 RC")
        app.d.ok("modify 0x610 INIT")
        agent.submit({"plan_id": "f", "assignments": [
            roce("old-fw", 0x600, 50000, app.d.pid),  # firmware cannot move a live QP
            roce("gone", 0x999, 50001, app.d.pid),  # no such QP in that process
            roce("nobody", 0x600, 50002, 1),  # pid 1 runs no library
            roce("destroyed", 0x610, 50003, app.d.pid),  # destroyed before RTR
            {"id": "noqp", "proto": "roce", "sport": 50004},
        ]})
        time.sleep(0.2)
        app.d.ok("destroy 0x610")
        r = plan_wait(agent)
        assert r["applied"] == []
        why = {f["id"]: f["reason"] for f in r["failed"]}
        assert "EOPNOTSUPP" in why["old-fw"] and "firmware" in why["old-fw"]
        assert "ENOENT" in why["gone"] and "0x999" in why["gone"]
        assert "no path-control library connected for pid 1" in why["nobody"]
        assert "ECANCELED" in why["destroyed"] and "destroyed" in why["destroyed"]
        assert "needs lqpn" in why["noqp"]
    finally:
        app.close()


def test_stale_epoch_and_silent_process(built: None, agent: PathControl, tmp_path: Path) -> None:
    app = App(tmp_path, agent, "preload")
    try:
        app.connect(0x700)
        app.d.ok("modify 0x700 INIT")  # stays in INIT: no answer until RTR
        agent.deadline = 0.3
        r = plan(agent, roce("w", 0x700, 50000, app.d.pid))
        assert r["applied"] == [] and "no answer" in r["failed"][0]["reason"]
        agent.submit({"plan_id": "new", "epoch": 5, "assignments": []})
        assert plan_wait(agent) == {"plan_id": "new", "applied": [], "failed": []}
        agent.submit({"plan_id": "older", "epoch": 4,
                      "assignments": [roce("s", 0x700, 50000, app.d.pid)]})
        r = plan_wait(agent)
        assert "stale plan" in r["failed"][0]["reason"]
    finally:
        app.close()


def test_library_refuses_garbage_and_agent_refuses_forged_results(built: None, agent: PathControl,
                                                                  tmp_path: Path) -> None:
    """The socket is local but untrusted: a result for a token the connection was never given
    is counted and dropped, and the application keeps working."""
    import socket as so

    from c4.agent.pathctl import MAGIC, MSG, RESULT, VERSION

    with so.socket(so.AF_UNIX, so.SOCK_SEQPACKET) as s:
        s.connect(str(agent.path))
        forged = MSG.pack(MAGIC, VERSION, RESULT, 12345, 1, 2, 3, 2, 0, b"x", b"y")
        s.send(forged)
        s.send(b"short")
        deadline = time.monotonic() + 5
        while agent.malformed < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)


class FakeAgent:
    """The agent's end of the socket under the test's control (when to read, when to hang up),
    speaking the real message format (c4.agent.pathctl)."""

    def __init__(self, path: Path) -> None:
        import socket as so

        self.listener = so.socket(so.AF_UNIX, so.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self.listener.settimeout(10)
        self.path = path

    def accept(self) -> Any:
        conn, _ = self.listener.accept()
        return conn

    def close(self) -> None:
        self.listener.close()


def results_on(conn: Any, want: int, timeout: float) -> list[Any]:
    """Up to `want` result messages read from `conn` within `timeout` seconds."""
    from c4.agent.pathctl import MSG, decode_result

    out = []
    conn.settimeout(0.05)
    deadline = time.monotonic() + timeout
    while len(out) < want and time.monotonic() < deadline:
        try:
            data = conn.recv(MSG.size + 1)
        except TimeoutError:
            continue
        if not data:
            break
        r = decode_result(data)
        assert r is not None
        out.append(r)
    return out


def fake_app(tmp_path: Path, sock: Path) -> harness.Driver:
    env = dict(os.environ, C4_PATHCTL_IBVERBS=TESTLIB, C4_PATHCTL_MLX5=TESTLIB,
               C4_PATHCTL_SOCKET=str(sock), C4TEST_VERBS_LOG=str(tmp_path / "log.jsonl"),
               LD_PRELOAD=str(PATHCTL / "build" / "libc4-pathctl.so"))
    return harness.Driver(env=env)


def test_results_the_socket_could_not_take_are_sent_when_it_drains(built: None,
                                                                   tmp_path: Path) -> None:
    """An agent that reads late fills the library's socket buffer: the results queued behind it
    go out as soon as there is room again, not at some later wake."""
    from c4.agent.pathctl import encode_assign

    agent = FakeAgent(tmp_path / "pc.sock")
    d = fake_app(tmp_path, agent.path)
    try:
        d.ok("open 1")
        d.ok("create 0x100 RC")  # starts the library's agent thread
        conn = agent.accept()
        n = 600  # several socket buffers' worth, under the library's 1,024-result outbox
        for token in range(1, n + 1):
            conn.send(encode_assign(token, 0x5000 + token, 50000, ROCE_V2_DEV))
        time.sleep(0.5)  # the library answers each (ENOENT) into a full socket
        got = results_on(conn, n, timeout=5)
        assert sorted(r.token for r in got) == list(range(1, n + 1))
        conn.close()
    finally:
        d.close()
        agent.close()


def test_send_error_forgets_the_agent_and_its_tokens(built: None, tmp_path: Path) -> None:
    """A send that fails (the agent stopped reading: EPIPE) ends that connection like a hang-up
    does: the next agent never receives results for tokens the previous one issued (its own
    tokens start at 1 again), while the planned port still takes effect."""
    import socket as so

    from c4.agent.pathctl import encode_assign

    agent = FakeAgent(tmp_path / "pc.sock")
    d = fake_app(tmp_path, agent.path)
    try:
        d.ok("open 1")
        d.ok("create 0x100 RC")
        conn = agent.accept()
        d.ok("modify 0x100 INIT")
        conn.send(encode_assign(7, 0x100, 4000, ROCE_V2_DEV))  # pending until RTS
        conn.shutdown(so.SHUT_RD)  # no POLLHUP for the library; its next send fails
        conn.send(encode_assign(8, 0x999, 4001, ROCE_V2_DEV))  # ENOENT, sent into EPIPE
        conn2 = agent.accept()  # the library reconnects
        d.ok("modify 0x100 RTR 0x200 0 10.0.0.2")
        d.ok("modify 0x100 RTS")
        assert results_on(conn2, 1, timeout=1) == []
        calls = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
        assert {"call": "udp_sport", "qpn": 0x100, "sport": 4000, "rc": 0} in calls
        conn.close()
        conn2.close()
    finally:
        d.close()
        agent.close()


def test_qp_table_finds_each_qp_among_colliding_ones(built: None, tmp_path: Path) -> None:
    """QP numbers that share one hash bucket (bucket() in pathctl.c), some destroyed: each
    assignment reaches exactly the QP it names, and only on the device it names."""
    from c4.agent.pathctl import encode_assign

    colliding = [0x100, 0x1B6D, 0x2BC2, 0x35DA, 0x462F, 0x5684]
    gone = (0x1B6D, 0x35DA)
    agent = FakeAgent(tmp_path / "pc.sock")
    d = fake_app(tmp_path, agent.path)
    try:
        d.ok("open 1")
        for q in colliding:
            d.ok(f"create {q:#x} RC")
            if q == colliding[0]:
                conn = agent.accept()
            d.ok(f"modify {q:#x} INIT")
            d.ok(f"modify {q:#x} RTR 0x9000 0 10.0.0.2")
            d.ok(f"modify {q:#x} RTS")
        for q in gone:
            d.ok(f"destroy {q:#x}")
        want = {}
        for token, q in enumerate(colliding, 1):
            conn.send(encode_assign(token, q, 1000 + token, ROCE_V2_DEV))
            want[token] = (errno.ENOENT, 0) if q in gone else (0, 1000 + token)
        conn.send(encode_assign(99, 0x100, 1099, ROCE_V1_DEV))  # not on that device
        want[99] = (errno.ENOENT, 0)
        got = {r.token: (r.err, r.sport) for r in results_on(conn, len(want), timeout=5)}
        assert got == want
        conn.close()
    finally:
        d.close()
        agent.close()
