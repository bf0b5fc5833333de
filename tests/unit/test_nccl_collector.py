"""The `nccl` collector: real datagrams (captured from the plugin) through a real Unix socket,
reports validated against the wire schema; job ids from a fixture /proc."""
from __future__ import annotations

import os
import socket
import struct
import stat
import time
from pathlib import Path

import msgpack
import pytest

from c4.agent.collectors.base import CollectorUnavailable, Context, OptionError
from c4.agent.collectors.nccl import NcclCollector
from c4.agent.jobs import JobResolver
from c4.agent.plugin_proto import decode
from c4.core.wire.kinds import validate_body
from tests import plugin_dgram as dgram

NOW = 1000.0


def _proc(root: Path, pid: int, env: dict[str, str], start: int = 12345) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (python3 x) " + " ".join(fields) + "\n")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


@pytest.fixture
def ctx(tmp_path):
    _proc(tmp_path / "proc", os.getpid(), {"HOME": "/root", "SLURM_JOB_ID": "4242"})
    return Context(host="gpu-1", proc_root=tmp_path / "proc", run_dir=tmp_path / "run")


@pytest.fixture
def golden(fixtures):
    return {p.stem: p.read_bytes() for p in (fixtures / "plugin").glob("*.bin")}


@pytest.fixture
def collector(ctx):
    c = NcclCollector(ctx, {})
    c.start()
    yield c
    c.close()


@pytest.fixture
def send(collector):
    """Sends datagrams and waits until the collector's reader has them."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(collector.path)

    def send(*datagrams: bytes) -> None:
        before = collector.backlog()
        for d in datagrams:
            s.sendto(d, path)
        deadline = time.monotonic() + 5
        while collector.backlog() < before + len(datagrams) and time.monotonic() < deadline:
            time.sleep(0.001)

    yield send
    s.close()


def _report(section):
    return validate_body("report", {"interval": 1.0, "health": {}, "nccl": section})["nccl"]


def test_summary_becomes_a_valid_report(collector, send, golden):
    send(golden["summary"])
    sample = collector.collect(NOW)
    nccl = _report(sample.section)
    (comm,) = nccl["comms"]
    s = decode(golden["summary"])
    assert (comm["comm"], comm["rank"], comm["nranks"]) == (s.header.comm, 3, 8)
    assert comm["pid"] == os.getpid()  # from SO_PASSCRED, not the datagram
    assert comm["job"] == "4242"
    assert comm["seq_started"] == s.seq_started and comm["seq_completed"] == s.seq_completed
    assert comm["inflight"]["seq"] == s.inflight.seq
    (coll,) = comm["colls"]
    assert coll == {"func": "AllReduce", "algo": "Ring", "proto": "Simple",
                    "count": s.colls[0].count, "bytes": s.colls[0].bytes,
                    "time_s": pytest.approx(s.colls[0].time_ns / 1e9)}
    assert len(comm["peers"]) == len(s.peers)
    for p in s.peers:
        (r,) = [x for x in comm["peers"] if (x["peer"], x["channel"], x["dir"]) ==
                (p.peer, p.channel, p.dir)]
        assert r["bytes"] == p.bytes and r["steps"] == p.steps
        assert r["net_wait_s"] == pytest.approx(p.net_wait_ns / 1e9)
    assert comm["entry_ops"] == s.entry_ops
    assert nccl["malformed"] == 0 and nccl["dropped"] == 0
    assert sample.events == []


def test_summaries_within_one_interval_add_up(collector, send, golden):
    send(golden["summary"], golden["summary"])
    (comm,) = _report(collector.collect(NOW).section)["comms"]
    s = decode(golden["summary"])
    assert comm["colls"][0]["count"] == 2 * s.colls[0].count
    assert sum(p["bytes"] for p in comm["peers"]) == 2 * sum(p.bytes for p in s.peers)
    # the next interval without datagrams: still reported (progress), no traffic twice
    (comm,) = _report(collector.collect(NOW + 0.1).section)["comms"]
    assert comm["colls"] == [] and comm["peers"] == [] and comm["seq_started"] == s.seq_started


def test_parts_are_reassembled(collector, send, golden):
    send(golden["multipart_1"], golden["multipart_0"])  # any order
    (comm,) = _report(collector.collect(NOW).section)["comms"]
    assert len(comm["peers"]) == 1500 and comm["colls"][0]["func"] == "Send"


def test_lost_part_is_counted_dropped(collector, send, golden):
    send(golden["multipart_0"])
    assert _report(collector.collect(NOW).section)["comms"] == []
    nccl = _report(collector.collect(NOW + 10).section)  # 5 intervals of 0.1 s passed
    assert nccl["comms"] == [] and nccl["dropped"] == 1


def test_stalled_becomes_an_event(collector, send, golden):
    send(golden["stalled"])
    (ev,) = collector.collect(NOW).events
    body = validate_body("event", ev.body())
    attrs = body["attrs"]
    assert body["type"] == "nccl_stall" and body["severity"] == "error"
    assert (attrs["comm"], attrs["rank"], attrs["func"], attrs["job"]) == (
        "c4a11ed000000004", 2, "AllReduce", "4242")
    assert attrs["waiting"] == [{"peer": 1, "channel": 0, "dir": "recv", "state": "RecvWait",
                                 "idle_s": pytest.approx(attrs["waiting"][0]["idle_s"])}]
    assert attrs["age_s"] >= 0.3 and "rank 1 (recv ch 0, RecvWait)" in ev.msg
    assert collector.collect(NOW + 0.1).events == []


def test_malformed_is_counted_and_the_rest_kept(collector, send, golden):
    send(b"garbage", golden["summary"][:-1], golden["summary"])
    nccl = _report(collector.collect(NOW).section)
    assert nccl["malformed"] == 2 and len(nccl["comms"]) == 1
    assert collector.malformed == {"short": 1, "length": 1}


def test_final_summary_is_reported_once(collector, send, golden):
    send(golden["summary"], golden["summary_final"])
    assert len(_report(collector.collect(NOW).section)["comms"]) == 1
    assert _report(collector.collect(NOW + 0.1).section)["comms"] == []


def test_silent_communicator_goes_stale(collector, send, golden):
    send(golden["summary"])
    collector.collect(NOW)
    # the plugin's interval is 100 ms; 5 intervals without a datagram: process gone
    assert len(_report(collector.collect(NOW + 0.4).section)["comms"]) == 1
    assert _report(collector.collect(NOW + 0.6).section)["comms"] == []


def test_socket_permissions_and_cleanup(ctx):
    c = NcclCollector(ctx, {})
    c.start()
    mode = os.stat(c.path).st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o660
    assert c.path == ctx.run_dir / "plugin.sock"
    c.close()
    assert not c.path.exists()


def test_stale_socket_is_replaced_live_one_is_not(ctx, tmp_path):
    path = tmp_path / "p.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(path))
    dead.close()  # the file stays behind, nobody bound
    c = NcclCollector(ctx, {"socket": str(path)})
    c.start()
    try:
        with pytest.raises(CollectorUnavailable, match="in use"):
            NcclCollector(ctx, {"socket": str(path)}).start()
    finally:
        c.close()
    path.write_text("not a socket")
    with pytest.raises(CollectorUnavailable, match="not a socket"):
        NcclCollector(ctx, {"socket": str(path)}).start()


@pytest.mark.parametrize("options,key", [
    ({"sockett": "x"}, "sockett"),
    ({"rcvbuf": 10}, "rcvbuf"),
    ({"stale_intervals": 0}, "stale_intervals"),
    ({"buffer_bytes": 1000}, "buffer_bytes"),
    ({"socket": 5}, "socket"),
    ({"socket_group": "no-such-group-c4"}, "socket_group"),
    ({"job_env": "SLURM_JOB_ID"}, "job_env"),
])
def test_bad_options(ctx, options, key):
    with pytest.raises(OptionError, match=rf"collectors\.nccl\.{key}"):
        NcclCollector(ctx, options)


def test_every_option_is_documented():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plugin.md").read_text()
    for key in NcclCollector.OPTIONS:
        assert f"| `{key}` |" in doc, key


def test_job_resolver(tmp_path):
    _proc(tmp_path, 10, {"SLURM_JOB_ID": "77", "C4_JOB_ID": "train-a"})
    _proc(tmp_path, 11, {"TORCHELASTIC_RUN_ID": "run-9", "SLURM_JOB_ID": " "})
    _proc(tmp_path, 12, {"PATH": "/bin", "SLURM_JOB_ID": "x" * 200})
    jobs = JobResolver(tmp_path)
    assert jobs.job_of(10) == "train-a"  # the explicit id wins
    assert jobs.job_of(11) == "run-9"  # blank values are skipped
    assert jobs.job_of(12) is None  # too long for the report
    assert jobs.job_of(13) is None  # no such process
    assert JobResolver(tmp_path, ("SLURM_JOB_ID",)).job_of(10) == "77"
    _proc(tmp_path, 10, {"SLURM_JOB_ID": "78"})  # same start time: cached
    assert jobs.job_of(10) == "train-a"
    _proc(tmp_path, 10, {"SLURM_JOB_ID": "78"}, start=99999)  # pid reused
    assert jobs.job_of(10) == "78"


def test_buffer_overflow_is_counted_dropped(ctx, golden):
    c = NcclCollector(ctx, {"buffer_bytes": 1 << 20})
    c.start()
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(True)  # wait for the reader rather than for the kernel queue
        big = golden["multipart_0"]  # ~60 KiB: 17 fit in 1 MiB
        for _ in range(30):
            s.sendto(big, str(c.path))
        deadline = time.monotonic() + 5
        while c.backlog() < 17 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        nccl = _report(c.collect(NOW).section)
        assert c.backlog() == 0
        assert nccl["dropped"] == 30 - 17
        assert nccl["malformed"] == 16  # the 17 kept repeat one part of one message
        s.close()
    finally:
        c.close()


def test_datagrams_the_plugin_could_not_send_are_reported(collector, send, golden):
    from c4.agent.plugin_proto import HEADER

    data = bytearray(golden["summary"])
    struct.pack_into("<Q", data, HEADER.size - 8, 7)  # the header's last field: unsent count
    send(bytes(data))
    nccl = _report(collector.collect(NOW).section)
    assert nccl["plugin_unsent"] == 7 and len(nccl["comms"]) == 1


@pytest.mark.parametrize("ncomms", [1, 20])
def test_the_section_is_encoded_once_and_exactly(collector, send, ncomms):
    """The agent sends the collector's bytes (its size check and the sender take them instead
    of encoding the section again): they must be the section's encoding, also past 15
    communicators (a longer array header)."""
    send(*(dgram.summary([(1, 0, 0, 10)], colls=1, comm=0x100 + i) for i in range(ncomms)))
    sample = collector.collect(NOW)
    assert len(sample.section["comms"]) == ncomms
    assert sample.encoded == msgpack.packb(sample.section)
