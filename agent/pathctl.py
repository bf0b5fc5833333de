"""Plan application: the agent's side of C4P (docs/planning.md, "Applying plans").

A `plan` frame carries source-port assignments for this host's flows. The agent cannot change
another process's QP or socket, so it hands each assignment to the process that owns the flow
and answers one `plan_result` with what took effect and why the rest did not:

- `roce`: to the path-control library (plugin/pathctl, libc4-pathctl.so) inside the process
  owning the QP. Libraries connect to the agent's Unix SOCK_SEQPACKET socket (the agent is the
  server; the kernel names each peer's pid with SO_PEERCRED) and exchange fixed 192-byte
  messages (plugin/pathctl/pathctl_proto.h). The agent never waits on a process: it sends
  without blocking and collects results on its own thread until the plan's deadline.
- `tcp`: into the planned-ports file that the connect() interposer (libc4-connect.so) reads at
  each connect(); the port takes effect when the application (re)connects. The agent reports
  applied when /proc/net/tcp shows the connection on its planned port within `tcp_wait` (a job
  reconnects at a step boundary, seconds away: the lab's 16-host ring did after the 2 s a QP
  gets, and every assignment of its plans read "reconnect to apply"). The
  socket thread reads it, at most every TCP_RECHECK_S while such a plan is in flight: the file
  lists every connection in the namespace, too much to parse on the agent's loop.

Nothing read from the socket is trusted: a message of the wrong size, magic or type, or with a
token this connection was not given, is dropped and counted.
"""
from __future__ import annotations

import errno
import grp
import logging
import os
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .tcp_ports import PortsFile, established, norm_addr
from .unixsock import remove_stale

log = logging.getLogger("c4.agent.pathctl")

MAGIC = 0x43503443
VERSION = 1
ASSIGN, RESULT = 1, 2
HOW = {1: "flow label at INIT->RTR", 2: "mlx5dv_modify_qp_udp_sport"}
MSG = struct.Struct("=IHHQIIHHi64s96s")
assert MSG.size == 192
MAX_SHIMS = 4096
TCP_RECHECK_S = 0.25


def errname(err: int) -> str:
    """errno name as the C headers spell it (Python's table says ENOTSUP for 95)."""
    return "EOPNOTSUPP" if err == errno.EOPNOTSUPP else errno.errorcode.get(err, str(err))


def encode_assign(token: int, lqpn: int, sport: int, dev: str | None) -> bytes:
    return MSG.pack(MAGIC, VERSION, ASSIGN, token, lqpn, 0, sport, 0, 0,
                    (dev or "").encode()[:63], b"")


@dataclass(frozen=True)
class ShimResult:
    token: int
    lqpn: int
    rqpn: int
    sport: int
    how: int
    err: int
    dev: str
    detail: str


def decode_result(data: bytes) -> ShimResult | None:
    """A library's result message, or None if it is not one."""
    if len(data) != MSG.size:
        return None
    magic, version, kind, token, lqpn, rqpn, sport, how, err, dev, detail = MSG.unpack(data)
    if magic != MAGIC or version != VERSION or kind != RESULT or not 0 <= err < 4096:
        return None

    def text(raw: bytes) -> str:
        return raw.split(b"\0", 1)[0].decode("utf-8", "replace")

    return ShimResult(token, lqpn, rqpn, sport, how, err, text(dev), text(detail))


@dataclass
class _Wait:
    """One assignment waiting for answers."""
    aid: str
    proto: str
    sport: int
    tokens: set[int] = field(default_factory=set)
    failures: list[str] = field(default_factory=list)
    applied: int | None = None
    failed: str | None = None
    tcp: tuple[str, int] | None = None  # (dst, dport)


@dataclass
class _Job:
    plan_id: str
    deadline: float
    tcp_deadline: float
    waits: dict[str, _Wait] = field(default_factory=dict)

    def done(self) -> bool:
        return all(w.applied is not None or w.failed is not None or (not w.tokens and w.tcp is None)
                   for w in self.waits.values())

    def tcp_waits(self) -> list[_Wait]:
        return [w for w in self.waits.values() if w.tcp is not None and w.applied is None]

    def body(self) -> dict[str, Any]:
        applied, failed = [], []
        for w in self.waits.values():
            if w.applied is not None:
                applied.append({"id": w.aid, "sport": w.applied})
            else:
                reason = w.failed or "; ".join(dict.fromkeys(w.failures)) or "no answer"
                failed.append({"id": w.aid, "reason": reason[:512]})
        return {"plan_id": self.plan_id, "applied": applied, "failed": failed}


class PathControl:
    """The agent's path-control socket and the plans in flight."""

    def __init__(self, run_dir: Path, *, socket_path: Path | None = None,
                 socket_group: str | None = None, tcp_ports: Path | None = None,
                 deadline: float = 2.0, tcp_wait: float = 30.0,
                 proc_root: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = socket_path or run_dir / "pathctl.sock"
        self.gid = grp.getgrnam(socket_group).gr_gid if socket_group else None
        self.ports = PortsFile(tcp_ports or run_dir / "tcp-ports")
        self.deadline = deadline  # a QP's answer from the process owning it
        self.tcp_wait = tcp_wait  # a connection on its planned port
        self.proc_root = proc_root
        self.clock = clock
        self.malformed = 0
        self.epoch = -1
        self._lock = threading.Lock()
        self._shims: dict[int, tuple[socket.socket, int]] = {}  # fd -> (socket, pid)
        self._tokens: dict[int, tuple[_Job, _Wait, int]] = {}  # token -> (job, wait, fd)
        self._next_token = 1
        self._jobs: list[_Job] = []
        self._listener: socket.socket | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._stop = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(self.path, socket.SOCK_SEQPACKET)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            s.bind(str(self.path))
            os.chmod(self.path, 0o660)  # training users connect through their group
            if self.gid is not None:
                os.chown(self.path, -1, self.gid)
            s.listen(64)
            s.setblocking(False)
        except OSError:
            s.close()
            raise
        self._listener = s
        self._thread = threading.Thread(target=self._run, name="c4-pathctl", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop = True
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            for s, _ in self._shims.values():
                s.close()
            self._shims.clear()
        if self._listener is not None:
            self._listener.close()
            try:
                os.unlink(self.path)
            except OSError:
                pass
        os.close(self._wake_r)
        os.close(self._wake_w)

    def connected_pids(self) -> list[int]:
        with self._lock:
            return sorted(pid for _, pid in self._shims.values())

    # -- plans ----------------------------------------------------------------------------
    def submit(self, body: dict[str, Any]) -> None:
        """Start applying a validated `plan` body; its plan_result comes from results()."""
        now = self.clock()
        job = _Job(body["plan_id"], now + self.deadline, now + self.tcp_wait)
        epoch = body.get("epoch")
        stale = epoch is not None and epoch < self.epoch
        if epoch is not None and not stale:
            self.epoch = epoch
        tcp_rules = {}
        moved_off: list[tuple[str, int, int]] = []
        for a in body["assignments"]:
            w = _Wait(a["id"], a["proto"], a["sport"])
            job.waits[a["id"]] = w
            if stale:
                w.failed = f"stale plan: epoch {epoch} is older than epoch {self.epoch} applied"
            elif a["proto"] == "tcp":
                try:
                    w.tcp = (norm_addr(a["dst"]), a["dport"])
                    tcp_rules[a["id"]] = (a["dst"], a["dport"], a["sport"])
                    if a.get("old_sport") is not None:
                        moved_off.append((a["dst"], a["dport"], a["old_sport"]))
                except (KeyError, ValueError):
                    w.failed = "a tcp assignment needs dst (an IP address) and dport"
            elif a.get("lqpn") is None:
                w.failed = "a roce assignment needs lqpn"
            else:
                self._send_roce(job, w, a)
        if tcp_rules:
            try:
                self.ports.update(tcp_rules, moved_off)
            except OSError as exc:
                for w in job.waits.values():
                    if w.tcp is not None:
                        w.failed = f"cannot write {self.ports.path}: {exc.strerror}"
                        w.tcp = None
        with self._lock:
            self._jobs.append(job)
        if job.tcp_waits() and self._thread is not None:
            try:
                os.write(self._wake_w, b"t")  # the socket thread checks TCP from now on
            except BlockingIOError:  # a wake-up is pending already
                pass

    def _send_roce(self, job: _Job, w: _Wait, a: dict[str, Any]) -> None:
        pid = a.get("pid")
        with self._lock:
            targets = [(fd, s, p) for fd, (s, p) in self._shims.items() if pid is None or p == pid]
            if not targets:
                w.failed = (f"no path-control library connected for pid {pid}" if pid is not None
                            else "no process with the path-control library is connected") + \
                    " (enable it with NCCL_IBVERBS_LIB or LD_PRELOAD, docs/planning.md)"
                return
            for fd, s, p in targets:
                token = self._next_token
                self._next_token += 1
                try:
                    s.send(encode_assign(token, a["lqpn"], a["sport"], a.get("dev")),
                           socket.MSG_DONTWAIT)
                except OSError as exc:
                    w.failures.append(f"pid {p}: cannot send ({exc.strerror})")
                    continue
                w.tokens.add(token)
                self._tokens[token] = (job, w, fd)

    def pending(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def results(self) -> list[dict[str, Any]]:
        """plan_result bodies of the plans that are complete or past their deadline (a TCP
        assignment past it once the socket thread has had its last look)."""
        now = self.clock()
        out = []
        with self._lock:
            for job in list(self._jobs):
                if not (job.done() or (now >= job.deadline and not job.tcp_waits())):
                    continue
                self._jobs.remove(job)
                for w in job.waits.values():
                    for t in w.tokens:
                        self._tokens.pop(t, None)
                    if w.applied is None and w.failed is None and w.tokens:
                        w.failures.append(f"no answer from the process within {self.deadline:g} s "
                                          f"(the QP may not have reached RTR yet; the port is "
                                          f"applied when it does)")
                out.append(job.body())
        return out

    def _check_tcp(self) -> bool:
        """On the socket thread: one read of the connection table for every plan waiting on
        TCP, final for those past their TCP deadline. Returns whether any still wait."""
        with self._lock:
            if not any(job.tcp_waits() for job in self._jobs):
                return False
        conns = established(self.proc_root)
        now = self.clock()
        with self._lock:
            for job in self._jobs:
                self._match_tcp(job, conns, final=now >= job.tcp_deadline)
            return any(job.tcp_waits() for job in self._jobs)

    @staticmethod
    def _match_tcp(job: _Job, conns: list[tuple[int, str, int]], *, final: bool) -> None:
        for w in job.tcp_waits():
            assert w.tcp is not None
            dst, dport = w.tcp
            live = [lport for lport, raddr, rport in conns if raddr == dst and rport == dport]
            if w.sport in live:
                w.applied = w.sport
                w.tcp = None
            elif final:
                w.failed = (f"set for the next connect() to {dst}:{dport}; the live connection "
                            f"uses port {live[0]}: reconnect to apply" if live else
                            f"set for the next connect() to {dst}:{dport}; no connection to it yet")
                w.tcp = None

    # -- socket thread --------------------------------------------------------------------
    def _run(self) -> None:
        assert self._listener is not None
        poller = select.poll()
        poller.register(self._listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        tcp_waiting, next_tcp = False, 0.0
        while not self._stop:
            timeout = max(0.0, next_tcp - self.clock()) if tcp_waiting else 1.0
            for fd, ev in poller.poll(timeout * 1000):
                if fd == self._wake_r:
                    os.read(self._wake_r, 4096)
                    tcp_waiting = True  # a new TCP plan: check it now
                elif fd == self._listener.fileno():
                    self._accept(poller)
                else:
                    self._read(fd, ev, poller)
            if tcp_waiting and self.clock() >= next_tcp:
                tcp_waiting = self._check_tcp()
                next_tcp = self.clock() + TCP_RECHECK_S

    def _accept(self, poller: select.poll) -> None:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._lock:
            if len(self._shims) >= MAX_SHIMS:
                conn.close()
                return
            cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", cred)[0]
            conn.setblocking(False)
            self._shims[conn.fileno()] = (conn, pid)
        poller.register(conn, select.POLLIN)
        log.info("path-control library connected: pid %d", pid)

    def _read(self, fd: int, ev: int, poller: select.poll) -> None:
        with self._lock:
            entry = self._shims.get(fd)
        if entry is None:
            return
        conn, pid = entry
        while True:
            try:
                data = conn.recv(MSG.size + 1)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                poller.unregister(fd)
                with self._lock:
                    self._shims.pop(fd, None)
                    for token, (_, w, tfd) in list(self._tokens.items()):
                        if tfd == fd:
                            w.tokens.discard(token)
                            w.failures.append(f"pid {pid} disconnected before answering")
                            del self._tokens[token]
                conn.close()
                log.info("path-control library disconnected: pid %d", pid)
                return
            self._on_result(fd, pid, data)

    def _on_result(self, fd: int, pid: int, data: bytes) -> None:
        r = decode_result(data)
        with self._lock:
            hit = self._tokens.get(r.token) if r else None
            if r is None or hit is None or hit[2] != fd:
                self.malformed += 1
                return
            job, w, _ = hit
            del self._tokens[r.token]
            w.tokens.discard(r.token)
            if w.applied is not None:
                return
            if r.err == 0:
                w.applied = r.sport
                log.info("plan %s: %s -> port %d on QP 0x%x (%s), pid %d", job.plan_id, w.aid,
                         r.sport, r.lqpn, HOW.get(r.how, "?"), pid)
                return
            # One process's ENOENT is no verdict while another asked may own the QP.
            w.failures.append(f"pid {pid}: {errname(r.err)}: {r.detail}")
            if not w.tokens:
                w.failed = "; ".join(dict.fromkeys(w.failures))
