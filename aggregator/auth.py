"""Who may speak on the ingest socket: CURVE with a ZAP handler that admits enrolled keys only.

CURVE alone encrypts and proves that a client holds the secret of the public key it presents,
but admits *any* key: libzmq asks the ZAP handler (RFC 27, inproc://zeromq.zap.01) whether a
key is welcome, and without a handler it lets everyone in. The ingest socket therefore sets a
ZAP domain with ZAP_ENFORCE_DOMAIN, so a missing or dead handler refuses every client instead.

The handler answers with the client's Z85 public key as ZAP User-Id; ZeroMQ attaches it to
every message of that connection (`frame.get("User-Id")`), and the ingest loop looks up the
key's host in the store *at that moment*, so a revoked key stops counting on connections that
were admitted before the revocation.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Any

import zmq
from zmq.utils import z85

from c4.core.keys import EnrolledKeys

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"c4"
DENY_REASONS = ("unenrolled", "mechanism", "bad_request")


class ZapHandler:
    """A thread answering ZAP requests for the sockets of one ZeroMQ context."""

    def __init__(self, ctx: zmq.Context[Any], keys: EnrolledKeys,
                 log: logging.Logger | None = None) -> None:
        self.keys = keys
        self.log = log or logging.getLogger("c4.aggregator.auth")
        self.allowed = 0
        self.denied: Counter[str] = Counter()
        self._last_log: dict[str, float] = {}
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)  # before any CURVE socket binds: no window without ZAP
        self._thread = threading.Thread(target=self._serve, name="c4-zap", daemon=True)
        self._thread.start()

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request (version, id, domain, address, routing id, mechanism,
        credentials...)."""
        if len(request) < 6 or request[0] != b"1.0":
            self.denied["bad_request"] += 1
            rid = request[1] if len(request) > 1 else b""
            return [b"1.0", rid, b"400", b"bad ZAP request", b"", b""]
        _, rid, _domain, address, _routing_id, mechanism, *creds = request
        if mechanism != b"CURVE" or len(creds) != 1 or len(creds[0]) != 32:
            return self._deny(rid, "mechanism", f"{mechanism.decode(errors='replace')} "
                              f"from {address.decode(errors='replace')}: CURVE only")
        key = z85.encode(creds[0])
        self.keys.refresh()
        if self.keys.host_for(key) is None:
            return self._deny(rid, "unenrolled", f"key {key.decode()} from "
                              f"{address.decode(errors='replace')} is not enrolled "
                              f"(`c4 keys enroll`)")
        self.allowed += 1
        return [b"1.0", rid, b"200", b"OK", key, b""]

    def _deny(self, rid: bytes, reason: str, detail: str) -> list[bytes]:
        self.denied[reason] += 1
        now = time.monotonic()
        if now - self._last_log.get(reason, -1e18) >= 10.0:  # a scanner must not flood the log
            self._last_log[reason] = now
            self.log.warning("refused a connection: %s", detail)
        return [b"1.0", rid, b"400", reason.encode(), b"", b""]

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                if not self._sock.poll(200):
                    continue
                request = self._sock.recv_multipart()
            except zmq.ZMQError:
                return  # context terminated
            try:
                reply = self.answer(request)
            except Exception:  # a bug here must refuse one client, never stop authenticating
                self.log.exception("ZAP handler error")
                reply = [b"1.0", request[1] if len(request) > 1 else b"", b"500",
                         b"internal error", b"", b""]
            try:
                self._sock.send_multipart(reply)
            except zmq.ZMQError:
                return

    def stats(self) -> dict[str, object]:
        return {"allowed": self.allowed,
                "denied": {r: self.denied.get(r, 0) for r in DENY_REASONS},
                "enrolled": len(self.keys)}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        self._sock.close(0)


def curve_server(sock: zmq.Socket[Any], public: bytes, secret: bytes) -> None:
    """Make `sock` a CURVE server whose clients must pass the ZAP handler."""
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
