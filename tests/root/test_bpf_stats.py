"""BPF program run counts and run time, as ebpf_exporter exports them, from a real program."""
from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from c4.agent import bpf_stats
from c4.agent.exporter import AgentMetrics, Snapshot
from tests.promtool import check_metrics, parse


def test_run_count_and_time_of_our_programs() -> None:
    bcc = pytest.importorskip("bcc")
    b = bcc.BPF(text=b"TRACEPOINT_PROBE(sock, inet_sock_set_state) { return 0; }")
    metrics = AgentMetrics(lambda: Snapshot(), lambda: {}, infiniband=False)
    metrics.bpf_stats_fd = bpf_stats.enable_stats()
    try:
        for _ in range(5):  # each refused connect changes socket state at least twice
            with socket.socket() as s:
                s.connect_ex(("127.0.0.1", 1))
        reg = CollectorRegistry(auto_describe=False)
        reg.register(metrics)
        text = generate_latest(reg).decode()
    finally:
        os.close(metrics.bpf_stats_fd)
        b.cleanup()
    m = parse(text)
    (info,) = [k for k in m if k.startswith("c4_agent_bpf_program_info{")]
    assert 'type="tracepoint"' in info and 'program="sock__inet_sock"' in info
    prog_id = info.split('id="')[1].split('"')[0]
    key = f'{{id="{prog_id}",program="sock__inet_sock"}}'
    assert m[f"c4_agent_bpf_program_run_count_total{key}"] >= 10
    assert m[f"c4_agent_bpf_program_run_time_seconds_total{key}"] > 0
    assert m["c4_agent_bpf_stats_enabled"] == 1
    check_metrics(text)


def test_stats_stop_counting_when_the_fd_closes() -> None:
    bcc = pytest.importorskip("bcc")
    if Path("/proc/sys/kernel/bpf_stats_enabled").read_text().strip() != "0":
        pytest.skip("another process holds BPF statistics on")
    b = bcc.BPF(text=b"TRACEPOINT_PROBE(sock, inet_sock_set_state) { return 0; }")
    try:
        os.close(bpf_stats.enable_stats())
        before = {p.id: p.run_count for p in bpf_stats.own_programs()}
        with socket.socket() as s:
            s.connect_ex(("127.0.0.1", 1))
        after = {p.id: p.run_count for p in bpf_stats.own_programs()}
    finally:
        b.cleanup()
    assert before and before == after
