"""HTTP JSON API and Prometheus /metrics (stdlib http.server, one thread per request).

Routes (docs/api.md): /healthz, /api/v1/hosts, /api/v1/hosts/<name>, /api/v1/incidents,
/api/v1/incidents/<id>, /api/v1/jobs, /api/v1/stats, /metrics. Handlers read shared state
under the aggregator's lock; ingest holds the same lock while it applies a frame (server.py
describes the threads).
"""
from __future__ import annotations

import hmac
import json
import logging
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from . import openapi
from .ingest import Ingest
from .ui import PAGE

log = logging.getLogger("c4.aggregator.api")


POST_PATHS = ("/api/v1/plan/apply",)  # every other route is GET only
INCIDENT_ID = re.compile(r"[0-9]{1,18}")
# Idle or slow HTTP clients must not hold threads and file descriptors (the same descriptors
# ZeroMQ needs to accept agents): each connection gets this long per read or write, and at most
# this many are served at once; the rest are closed at accept.
API_TIMEOUT_S = 10.0
API_MAX_CONNECTIONS = 64


class NotFound(Exception):
    pass


class BadRequest(Exception):
    pass


class Unhealthy(Exception):
    """/healthz when the aggregator cannot do its job (a store that cannot write): 503."""

    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__("unhealthy")
        self.body = body


class Unauthorized(Exception):
    """401: a state-changing request without the right bearer token."""


class Forbidden(Exception):
    """403: state-changing requests are off (no `api_token_file` configured)."""


MAX_POST_BODY = 1 << 20


def require_token(authorization: str | None, token: str | None) -> None:
    """Admit a state-changing request only with `Authorization: Bearer <token>` matching the
    configured token (constant-time comparison). Every POST goes through this before its body
    is read; raises Forbidden when no token is configured, Unauthorized otherwise."""
    if not token:
        raise Forbidden("state-changing requests are disabled: set api_token_file in the "
                        "aggregator config")
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                              token.encode()):
        raise Unauthorized("missing or wrong bearer token (Authorization: Bearer ...)")


class Api:
    """The routes, independent of the HTTP server (so tests and replay can call them)."""

    def __init__(self, ingest: Ingest, diagnosis: Any, lock: threading.Lock,
                 clock: Callable[[], float] = time.time) -> None:
        self.ingest = ingest
        self.diagnosis = diagnosis
        self.lock = lock
        self.clock = clock
        self.started = clock()
        self.metrics = CollectorRegistry(auto_describe=False)
        self.metrics.register(_IngestMetrics(self))
        self.planner: Any = None  # C4P (planner/service.py): GET plan, POST plan/apply
        self.alerts: Any = None  # alerts.Alerts: its deliveries show in the incident route
        self.auth: Any = None  # the ZAP handler (auth.py); None with `insecure = true`
        self.token: str | None = None  # bearer token of POST requests (require_token)

    def get(self, path: str, query: dict[str, list[str]]) -> Any:
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if parts == ["api", "v1", "plan"] and self.planner is not None:
            # a stale proposal is made again with the optimiser outside the lock
            self.planner.refresh(self.lock, self.clock, "requested")
        now = self.clock()
        with self.lock:
            if parts == ["healthz"]:
                failing = self.ingest.store.failing
                health = {"ok": failing is None, "uptime_s": round(now - self.started, 3),
                          "hosts": len(self.ingest.registry.hosts),
                          "store": {"writable": failing is None,
                                    "error": failing[0] if failing else None,
                                    "since": failing[1] if failing else None}}
                if failing is not None:
                    raise Unhealthy(health)
                return health
            if parts[:2] != ["api", "v1"] or len(parts) < 3:
                raise NotFound(path)
            what, rest = parts[2], parts[3:]
            if what == "hosts" and not rest:
                hosts = self.ingest.registry.hosts
                return {"hosts": [hosts[n].summary(now) for n in sorted(hosts)]}
            if what == "hosts" and len(rest) == 1:
                h = self.ingest.registry.hosts.get(rest[0])
                if h is None:
                    raise NotFound(f"no host named {rest[0]!r}")
                return h.detail(now)
            if what == "openapi.json" and not rest:
                return openapi.spec()
            if what == "stats" and not rest:
                return self.stats()
            if what == "incidents" and not rest:
                states = query.get("state")
                state = states[0] if states else None
                if state not in (None, "open", "mitigated", "resolved"):
                    raise BadRequest("state must be open, mitigated or resolved")
                return {"incidents": self.diagnosis.incidents(state) if self.diagnosis else []}
            if what == "incidents" and len(rest) == 1:
                # ASCII digits only (str.isdigit takes "²") and below SQLite's 2^63.
                if not INCIDENT_ID.fullmatch(rest[0]):
                    raise BadRequest("incident id must be a decimal number of at most 18 digits")
                inc = self.diagnosis.incident(int(rest[0])) if self.diagnosis else None
                if inc is None:
                    raise NotFound(f"no incident {rest[0]}")
                if self.alerts is not None:
                    inc = dict(inc, alerts=self.alerts.status(inc["id"]))
                return inc
            if what == "plan" and not rest:
                if self.planner is None:
                    raise NotFound("planning is off (no topology, or [planning] enabled = "
                                   "false)")
                return self.planner.view(now)
            if what == "jobs" and not rest:
                return {"jobs": self.diagnosis.jobs() if self.diagnosis else []}
        raise NotFound(path)

    def stats(self) -> dict[str, Any]:
        st = self.ingest.stats()
        if self.auth is not None:
            st["auth"] = self.auth.stats()
        return st

    def post(self, path: str, body: dict[str, Any]) -> Any:
        """State-changing routes; the handler has checked the token (require_token)."""
        parts = [unquote(p) for p in path.strip("/").split("/") if p]
        if parts == ["api", "v1", "plan", "apply"] and self.planner is not None:
            self.planner.refresh(self.lock, self.clock, "apply", missing_only=True)
            with self.lock:
                return self.planner.apply(self.clock())
        raise NotFound(path)


class _IngestMetrics:
    """Prometheus view of ingest counters, computed at scrape time (nothing on the hot path)."""

    def __init__(self, api: Api) -> None:
        self.api = api

    def collect(self) -> Any:
        with self.api.lock:
            st = self.api.stats()
            hosts = list(self.api.ingest.registry.hosts.values())
        acc = CounterMetricFamily("c4_frames_accepted", "Frames accepted by kind", labels=["kind"])
        for k, v in sorted(st["accepted"].items()):
            acc.add_metric([k], v)
        yield acc
        rej = CounterMetricFamily("c4_frames_rejected", "Frames rejected by reason",
                                  labels=["reason"])
        for k, v in sorted(st["rejected"].items()):
            rej.add_metric([k], v)
        yield rej
        yield CounterMetricFamily("c4_frames_duplicate", "Resent frames already stored",
                                  value=st["duplicates"])
        yield CounterMetricFamily("c4_store_errors", "Frames that could not be stored",
                                  value=st["store_errors"])
        err = CounterMetricFamily("c4_internal_errors", "Failures of the aggregator's own code "
                                  "that were contained, by where", labels=["where"])
        for k, v in sorted(st["errors"].items()):
            err.add_metric([k], v)
        yield err
        g = GaugeMetricFamily("c4_hosts", "Hosts by status", labels=["status"])
        for status in ("up", "silent"):
            g.add_metric([status], sum(1 for h in hosts if h.status == status))
        yield g
        if "auth" in st:
            d = CounterMetricFamily("c4_auth_denied", "Agent connections refused by the ZAP "
                                    "handler, by reason", labels=["reason"])
            for k, v in sorted(st["auth"]["denied"].items()):
                d.add_metric([k], v)
            yield d


def make_handler(api: Api) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "c4-aggregator"

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            url = urlsplit(self.path)
            if url.path in ("/ui", "/ui/"):
                self._send(200, PAGE, "text/html; charset=utf-8")
                return
            if url.path == "/metrics":
                self._send(200, generate_latest(api.metrics), "text/plain; version=0.0.4")
                return
            if url.path.rstrip("/") in POST_PATHS:
                self._not_allowed()
                return
            # Blank values kept: `?state=` is a bad state (400), not no state.
            self._answer(lambda: api.get(url.path, parse_qs(url.query, keep_blank_values=True)))

        def do_POST(self) -> None:  # noqa: N802
            if urlsplit(self.path).path.rstrip("/") not in POST_PATHS:
                self._not_allowed()
                return
            def call() -> Any:
                require_token(self.headers.get("Authorization"), api.token)  # before the body
                return api.post(urlsplit(self.path).path, self._json_body())
            self._answer(call)

        def __getattr__(self, name: str) -> Any:
            # Any other method (PUT, DELETE, TRACE, ...): 405 in JSON, not http.server's 501.
            if name.startswith("do_"):
                return self._not_allowed
            raise AttributeError(name)

        def _not_allowed(self) -> None:
            allow = "POST" if urlsplit(self.path).path.rstrip("/") in POST_PATHS else "GET"
            self._send(405, json.dumps({"error": f"method {self.command} not allowed"}).encode(),
                       "application/json", {"Allow": allow})

        def _json_body(self) -> dict[str, Any]:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                raise BadRequest("bad Content-Length") from None
            if not 0 <= n <= MAX_POST_BODY:
                raise BadRequest(f"body must be at most {MAX_POST_BODY} bytes")
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError:
                raise BadRequest("body is not JSON") from None
            if not isinstance(body, dict):
                raise BadRequest("body must be a JSON object")
            return body

        def _answer(self, call: Callable[[], Any]) -> None:
            extra: dict[str, str] = {}
            try:
                body, code = call(), 200
            except NotFound as exc:
                body, code = {"error": f"not found: {exc}"}, 404
            except BadRequest as exc:
                body, code = {"error": str(exc)}, 400
            except Unhealthy as exc:
                body, code = exc.body, 503
            except Unauthorized as exc:
                body, code = {"error": str(exc)}, 401
                extra["WWW-Authenticate"] = 'Bearer realm="c4"'
            except Forbidden as exc:
                body, code = {"error": str(exc)}, 403
            except Exception as exc:  # a bug in one route must not take the API down
                log.exception("API error on %s", self.path)
                body, code = {"error": f"internal error: {type(exc).__name__}"}, 500
            self._send(code, json.dumps(body, sort_keys=True, default=str).encode(),
                       "application/json", extra)

        def _send(self, code: int, data: bytes, ctype: str,
                  headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler


class BoundedHTTPServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` of them; one over is closed at once."""

    daemon_threads = True
    request_queue_size = 128  # listen() backlog: a burst is accepted, then capped here

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 max_connections: int = API_MAX_CONNECTIONS,
                 timeout: float = API_TIMEOUT_S) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.timeout_s = timeout
        self.refused = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            self.refused += 1
            self.shutdown_request(request)
            return
        request.settimeout(self.timeout_s)  # per read or write: an idle client is dropped
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


def serve(api: Api, address: str, max_connections: int = API_MAX_CONNECTIONS,
          timeout: float = API_TIMEOUT_S) -> BoundedHTTPServer:
    host, _, port = address.rpartition(":")
    httpd = BoundedHTTPServer((host.strip("[]"), int(port)), make_handler(api), max_connections,
                              timeout)
    threading.Thread(target=httpd.serve_forever, name="c4-api", daemon=True).start()
    return httpd
