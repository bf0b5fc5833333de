"""BPF program run counts and run time, as ebpf_exporter exports them, from a real program."""
from __future__ import annotations

import os
import socket
import time
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



def test_runs_the_kernel_skipped_are_counted() -> None:
    """A tracepoint program does not run while another runs on its CPU: the kernel skips it
    and counts the miss (what it counts is then a lower bound: a CI run's tcp_flows saw 384 of
    nftables' 385 drops). Here the timer interrupt's program, during a syscall's long one."""
    bcc = pytest.importorskip("bcc")
    b = bcc.BPF(text=b"""
BPF_ARRAY(spin, u64, 1);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    for (int i = 0; i < 60000; i++) {  /* ~100 us: timer ticks land inside */
        int k = 0;
        u64 *v = spin.lookup(&k);
        if (v)
            __sync_fetch_and_add(v, 1);
    }
    return 0;
}
TRACEPOINT_PROBE(timer, hrtimer_expire_entry) { return 0; }
""")
    try:
        inner = b.funcs[b"tracepoint__timer__hrtimer_expire_entry"]
        deadline = time.monotonic() + 10
        while bpf_stats.prog_info(inner.fd).missed == 0 and time.monotonic() < deadline:
            for _ in range(100):
                os.getppid()
        missed = bpf_stats.prog_info(inner.fd).missed
        fdinfo = Path(f"/proc/self/fdinfo/{inner.fd}").read_text()
        reg = CollectorRegistry(auto_describe=False)
        reg.register(AgentMetrics(lambda: Snapshot(), lambda: {}, infiniband=False))
        m = parse(generate_latest(reg).decode())
        prog_id = bpf_stats.prog_info(inner.fd).id
    finally:
        b.cleanup()
    assert missed > 0
    assert f"recursion_misses:\t{missed}\n" in fdinfo  # the kernel's own account of it
    # and what the agent exports (the misses stop once the syscall program is gone)
    key = f'{{id="{prog_id}",program="timer__hrtimer_"}}'
    assert m[f"c4_agent_bpf_program_missed_total{key}"] >= missed
