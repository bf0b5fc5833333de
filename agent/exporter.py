"""The agent as a per-host Prometheus exporter (the node_exporter / DCGM-exporter convention).

Scrapes read what the agent's loop last collected, so they never race a collector; the one
thing read at scrape time is the agent's own eBPF program counters (bpf_stats.own_programs:
/proc/self/fd listed, one bpf(2) call per program fd), which are the kernel's and fresher than
any copy. Families (docs/operations.md):
- node_exporter's infiniband collector, same names and labels (`device`, `port`), from the
  `rdma` collector: port counters and hw_counters, state/physical state/rate, device info;
- `c4_agent_collector_duration_seconds` / `c4_agent_collector_success` per collector (the
  `node_scrape_collector_*` habit); a failed collector exports no stale section;
- `c4_agent_bpf_program_*`: run count and run time of the agent's eBPF programs (the
  ebpf_exporter families, `id` joins them with the `_info` metric);
- the NCCL plugin's datagram counters and the delivery counters of the agent -> aggregator link.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from c4 import __version__
from c4.core import catalog
from c4.core.ibmetrics import port_counter_families

from . import bpf_stats

log = logging.getLogger("c4.agent.exporter")
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Snapshot:
    """What one interval produced; the loop replaces it whole, scrapes read it."""

    sections: dict[str, Any] = field(default_factory=dict)  # collector -> its report section
    health: dict[str, dict[str, Any]] = field(default_factory=dict)
    durations: dict[str, float] = field(default_factory=dict)  # collector -> seconds
    nics: list[dict[str, Any]] = field(default_factory=list)  # hello inventory


class AgentMetrics:
    """prometheus_client custom collector over the agent's latest Snapshot."""

    def __init__(self, snapshot: Callable[[], Snapshot], sender: Callable[[], dict[str, int]],
                 *, infiniband: bool = True, bpf: bool = True) -> None:
        self.snapshot = snapshot
        self.sender = sender
        self.infiniband = infiniband
        self.bpf = bpf
        self.bpf_stats_fd: int | None = None

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        info = GaugeMetricFamily("c4_agent_build_info", "c4 agent version", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        yield from self._collectors(snap)
        yield from self._delivery(self.sender())
        if self.infiniband:
            yield from infiniband_metrics(snap.sections.get("rdma"), snap.nics)
        yield from _plugin_metrics(snap.sections.get("nccl"))
        if self.bpf:
            yield from self._bpf()

    def _collectors(self, snap: Snapshot) -> Iterator[Metric]:
        dur = GaugeMetricFamily("c4_agent_collector_duration_seconds",
                                "Time the collector's last collect took", labels=["collector"])
        ok = GaugeMetricFamily("c4_agent_collector_success",
                               "1 if the collector started and its last collect succeeded",
                               labels=["collector"])
        for name in sorted(snap.health):
            ok.add_metric([name], 1.0 if snap.health[name].get("ok") else 0.0)
            if name in snap.durations:
                dur.add_metric([name], snap.durations[name])
        yield dur
        yield ok

    def _delivery(self, c: dict[str, int]) -> Iterator[Metric]:
        for key, name, doc in (
                ("sent", "c4_agent_frames_sent", "Frames put on the wire the first time"),
                ("resent", "c4_agent_frames_resent", "Frames sent again for want of an ack"),
                ("acked", "c4_agent_frames_acked", "Frames the aggregator acknowledged"),
                ("errors_received", "c4_agent_errors_received",
                 "Error replies from the aggregator (rejected frames)"),
                ("reconnects", "c4_agent_reconnects", "Connections to the aggregator restarted")):
            yield CounterMetricFamily(name, doc, value=c.get(key, 0))
        dropped = CounterMetricFamily("c4_agent_frames_dropped",
                                      "Frames never delivered, by reason", labels=["reason"])
        dropped.add_metric(["queue_full"], c.get("dropped_queue_full", 0))
        dropped.add_metric(["invalid"], c.get("dropped_invalid", 0))
        yield dropped
        yield GaugeMetricFamily("c4_agent_frames_unacked", "Frames held until acked",
                                value=c.get("unacked", 0))

    def _bpf(self) -> Iterator[Metric]:
        progs = bpf_stats.own_programs()
        yield GaugeMetricFamily("c4_agent_bpf_stats_enabled",
                                "1 while the agent holds BPF run-time statistics on",
                                value=1.0 if self.bpf_stats_fd is not None else 0.0)
        info = GaugeMetricFamily("c4_agent_bpf_program_info", "The agent's eBPF programs",
                                 labels=["id", "program", "tag", "type"])
        runs = CounterMetricFamily("c4_agent_bpf_program_run_count",
                                   "Times the program ran (while statistics are on)",
                                   labels=["id", "program"])
        secs = CounterMetricFamily("c4_agent_bpf_program_run_time_seconds",
                                   "Time spent in the program (while statistics are on)",
                                   labels=["id", "program"])
        missed = CounterMetricFamily("c4_agent_bpf_program_missed",
                                     "Runs the kernel skipped: another BPF program was running "
                                     "on the same CPU (what the program counts is a lower bound)",
                                     labels=["id", "program"])
        for p in progs:
            info.add_metric([str(p.id), p.name, p.tag, p.type], 1)
            runs.add_metric([str(p.id), p.name], p.run_count)
            secs.add_metric([str(p.id), p.name], p.run_time_ns / 1e9)
            missed.add_metric([str(p.id), p.name], p.missed)
        yield info
        yield runs
        yield secs
        yield missed


def infiniband_metrics(section: dict[str, Any] | None,
                       nics: list[dict[str, Any]]) -> Iterator[Metric]:
    """node_exporter's infiniband families from one host's `rdma` section and inventory."""
    labels = ["device", "port"]
    info = GaugeMetricFamily(catalog.INFO_METRIC, "Non-numeric data from "
                             "/sys/class/infiniband/<device>, value is always 1.",
                             labels=["device", "board_id", "firmware_version", "hca_type"])
    for nic in nics:
        info.add_metric([nic["dev"], nic.get("board_id", ""), nic.get("fw_ver", ""),
                         nic.get("hca_type", "")], 1)
    yield info
    gauges = {m: GaugeMetricFamily(m, doc, labels=labels) for m, doc in (
        (catalog.STATE_METRIC, "State of the InfiniBand port (0: no change, 1: down, 2: init, "
                               "3: armed, 4: active, 5: act defer)"),
        (catalog.PHYS_STATE_METRIC, "Physical state of the InfiniBand port (0: no change, "
                                    "1: sleep, 2: polling, 3: disable, 4: shift, 5: link up, "
                                    "6: link error recover, 7: phytest)"),
        (catalog.RATE_METRIC, "Maximum signal transfer rate"))}
    ports = (section or {}).get("ports", [])
    for p in ports:
        where = [p["dev"], str(p["port"])]
        if p["state"] in catalog.PORT_STATE_IDS:
            gauges[catalog.STATE_METRIC].add_metric(where, catalog.PORT_STATE_IDS[p["state"]])
        if p.get("phys_state") in catalog.PHYS_STATE_IDS:
            gauges[catalog.PHYS_STATE_METRIC].add_metric(
                where, catalog.PHYS_STATE_IDS[p["phys_state"]])
        if p.get("rate_gbps") is not None:
            gauges[catalog.RATE_METRIC].add_metric(where, int(p["rate_gbps"] * catalog.BYTES_PER_GBIT))
    yield from gauges.values()
    yield from port_counter_families(
        (([p["dev"], str(p["port"])], p.get("counters", {})) for p in ports), labels)


def _plugin_metrics(section: dict[str, Any] | None) -> Iterator[Metric]:
    if section is None:
        return
    for key, name, doc in (
            ("malformed", "c4_agent_plugin_datagrams_malformed",
             "NCCL plugin datagrams the agent rejected"),
            ("dropped", "c4_agent_plugin_datagrams_dropped",
             "NCCL plugin datagrams the agent could not process"),
            ("plugin_unsent", "c4_agent_plugin_datagrams_unsent",
             "Datagrams the live training processes' plugins could not send")):
        yield CounterMetricFamily(name, doc, value=section.get(key, 0))
    yield GaugeMetricFamily("c4_agent_nccl_communicators",
                            "NCCL communicators the plugins report on",
                            value=len(section.get("comms", [])))


class Exporter:
    """The HTTP side: GET /metrics on `address` (host:port), in a daemon thread."""

    def __init__(self, metrics: AgentMetrics, address: str) -> None:
        self.metrics = metrics
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(metrics)
        host, _, port = address.rpartition(":")
        self.httpd = ThreadingHTTPServer((host.strip("[]") or "0.0.0.0", int(port)),
                                         _handler(self.registry))
        self.httpd.daemon_threads = True
        bound_host, bound_port = self.httpd.server_address[:2]
        self.address = f"{bound_host!s}:{bound_port}"
        threading.Thread(target=self.httpd.serve_forever, name="c4-exporter",
                         daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "c4-agent"

        def do_GET(self) -> None:  # noqa: N802 (http.server naming)
            if self.path.split("?", 1)[0] != "/metrics":
                body, code, ctype = b"c4 agent: see /metrics\n", 404, "text/plain"
            else:
                try:
                    body, code, ctype = generate_latest(registry), 200, CONTENT_TYPE
                except Exception as exc:  # a bug in one family must not kill the listener
                    log.exception("metrics scrape failed")
                    body, code, ctype = f"scrape failed: {exc}\n".encode(), 500, "text/plain"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

    return Handler
