"""Decoding and per-interval logic on map entries captured from the real program
(tests/fixtures/tcp_flows/capture.py: a scripted loopback exchange, one snapshot per step),
replayed as they were and edited to what the kernel would hold in other cases."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from c4.agent.collectors.tcp_flows import (
    FLOW_LAYOUT, HOT_FIELDS, HOT_LAYOUT, FlowEntry, Reporter, Snapshot, decode_event,
    detect_features, drop_counts, parse_options, proc_reader,
)
from tests.wire_check import validate_sample, validate_section


@pytest.fixture(scope="module")
def capture() -> dict[str, Any]:
    path = Path(__file__).resolve().parents[1] / "fixtures" / "tcp_flows" / "capture.json"
    return json.loads(path.read_text())


def snapshot(raw: dict[str, Any]) -> Snapshot:
    return Snapshot(
        live={int(k): bytes.fromhex(v) for k, v in raw["live"].items()},
        closed=[(bytes.fromhex(k), bytes.fromhex(v)) for k, v in raw["closed"]],
        stats={int(k): v for k, v in raw["stats"].items()},
        drop_slots={int(k): v for k, v in raw["drop_slots"].items()},
        events=[bytes.fromhex(e) for e in raw["events"]], perf_lost=raw["perf_lost"])


def reporter(fixtures: Path, netns: int = 4026531840, **options: Any) -> Reporter:
    feats = detect_features(fixtures / "tcp_flows" / "tracefs", "6.18.44", 16384)
    return Reporter(parse_options(options), feats, lambda pid: netns)


def replay(rep: Reporter, capture: dict[str, Any]) -> list[Any]:
    snaps = capture["snapshots"]
    out, prev = [], snaps[0]["t"] - 1.0
    for raw in snaps:
        out.append(rep.report(snapshot(raw), raw["t"] - prev))
        prev = raw["t"]
    return out


def by_ports(sample: Any, sport: int, dport: int) -> dict[str, Any]:
    [row] = [f for f in sample.section["flows"] if (f["sport"], f["dport"]) == (sport, dport)]
    return row


def test_decode_flow_entries(capture: dict[str, Any]) -> None:
    meta = capture["meta"]
    first = snapshot(capture["snapshots"][0])
    flows = {(e.sport, e.dport): e for e in map(FlowEntry.decode, first.live.values())}
    client = flows[(meta["client_port"], meta["port"])]
    server = flows[(meta["port"], meta["client_port"])]
    for e in (client, server):
        assert e.saddr[:4] == e.daddr[:4] == bytes([127, 0, 0, 1]) and e.family == 2
        assert (e.pid, e.comm, e.owner_known, e.closed) == (meta["pid"], meta["comm"], 1, 0)
        assert e.state == 1 and e.srtt_us > 0 and e.cwnd > 0 and e.cookie > 0
    assert client.bytes_acked == meta["first"]          # all data, acked
    assert server.bytes_received == meta["first"] + 1   # data + the client's extra byte
    assert client.bytes_received == server.bytes_acked == 2  # "ok"
    # the server's end came from its listener: C4P leaves it unplanned
    assert (server.accepted, client.accepted) == (1, 0)


def test_deltas_then_closed_once_then_forgotten(capture: dict[str, Any], fixtures: Path) -> None:
    meta = capture["meta"]
    cport, port = meta["client_port"], meta["port"]
    samples = replay(reporter(fixtures), capture)
    s1, s2, lost, closed, after, refused = samples

    c1, c2 = by_ports(s1, cport, port), by_ports(s2, cport, port)
    assert c1["bytes_acked_delta"] == c1["bytes_acked"] == meta["first"]  # new this interval
    assert c2["bytes_acked_delta"] == meta["second"] + 1
    assert by_ports(s2, port, cport)["bytes_received_delta"] == meta["second"] + 1
    interval = capture["snapshots"][1]["t"] - capture["snapshots"][0]["t"]
    assert c2["bytes_acked_rate"] == pytest.approx((meta["second"] + 1) / interval)
    assert c2["netns"] == 4026531840 and c2["closed"] is False
    # the server read the first transfer late: the client's probe found its window closed
    assert (c1["zero_window"], c1["zero_window_delta"]) == (1, 1)
    assert (c2["zero_window"], c2["zero_window_delta"]) == (1, 0)
    assert "zero_window" not in by_ports(s1, port, cport)  # the server's window never closed
    # no timeout until the third transfer's data was blackholed; then the client's timer
    # expired (~0.2 s and ~0.6 s into it), the server sent no data and has none
    assert "rto" not in c1 and "rto" not in c2
    c3 = by_ports(lost, cport, port)
    assert c3["rto"] == c3["rto_delta"] >= 2 and c3["retrans_segs_delta"] >= 2
    assert c3["bytes_acked_delta"] == meta["third"] + 1
    assert "rto" not in by_ports(lost, port, cport)

    done = {(f["sport"], f["dport"]): f for f in closed.section["flows"]}
    assert set(done) == {(cport, port), (port, cport)}
    assert all(f["closed"] and f["state"] == "CLOSE" for f in done.values())
    assert done[(cport, port)]["bytes_acked_delta"] == 0  # nothing moved since `lost`
    assert after.section["flows"] == [] and after.section["tracked"] == 0

    # the refused connect: a flow that closed from SYN_SENT, and two reset events
    [f] = refused.section["flows"]
    assert (f["dport"], f["closed"], f["bytes_acked"]) == (port, True, 0)
    kinds = {e.attrs["direction"]: e for e in refused.events}
    assert kinds["sent"].attrs["reason"] == "NO_SOCKET"
    assert (kinds["sent"].attrs["sport"], kinds["received"].attrs["dport"]) == (port, port)
    assert kinds["received"].attrs["pid"] == meta["pid"]


def test_reports_validate_against_the_wire_schema(capture: dict[str, Any],
                                                  fixtures: Path) -> None:
    for s in replay(reporter(fixtures), capture):
        validate_sample("tcp_flows", s)


def test_owners_of_job_flows_carry_their_process_state(capture: dict[str, Any],
                                                        fixtures: Path) -> None:
    """One state read per job process per report, listed flows or not (a stopped process's
    flows are all unchanged); processes without a job are not listed."""
    meta = capture["meta"]
    feats = detect_features(fixtures / "tcp_flows" / "tracefs", "6.18.44", 16384)
    states = iter(["S", "T", "T", "T"])
    reads: list[int] = []

    def proc_of(pid: int) -> dict[str, Any]:
        reads.append(pid)
        return {"state": next(states)}

    rep = Reporter(parse_options({}), feats, lambda pid: 0, job_of=lambda pid: "job-7",
                   proc_of=proc_of)
    snaps = [snapshot(raw) for raw in capture["snapshots"][:2]]
    first = rep.report(snaps[0], 1.0).section
    assert first["owners"] == [{"pid": meta["pid"], "state": "S", "job": "job-7"}]
    second = rep.report(snaps[1], 1.0).section
    idle = rep.report(snaps[1], 1.0).section  # nothing changed: no flow listed
    assert second["owners"][0]["state"] == idle["owners"][0]["state"] == "T"
    assert idle["flows"] == [] and idle["unchanged"] == 2
    validate_sample("tcp_flows", rep.report(snaps[1], 1.0))
    assert reads == [meta["pid"]] * 4
    nojob = Reporter(parse_options({}), feats, lambda pid: 0, proc_of=proc_of)
    assert "owners" not in nojob.report(snaps[0], 1.0).section


def test_proc_reader(tmp_path: Path) -> None:
    (tmp_path / "42").mkdir()
    # utime 300, stime 100 ticks (fields 14, 15); no io file: written absent, not 0
    (tmp_path / "42" / "stat").write_text("42 (a) b) (c) T 1 42 42 0 -1 4194560 0 0 0 0 300 100 "
                                          + "0 " * 40)
    read = proc_reader(tmp_path)
    tick = os.sysconf("SC_CLK_TCK")
    assert read(42) == {"state": "T", "cpu_s": 400 / tick}  # after the last ')' of the name
    assert read(43) == {"state": "X"}  # gone: no counters


def test_proc_reader_counts_a_real_child_writing(tmp_path: Path) -> None:
    """A child that burns CPU then writes: its real /proc/<pid>/io wchar and its CPU time
    advance; once it is reaped, both are absent (ENOENT), not 0."""
    import subprocess
    import sys
    out = tmp_path / "ckpt"
    child = subprocess.Popen([sys.executable, "-c",
                              "import sys, time\n"
                              "t = time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\n"
                              f"with open({str(out)!r}, 'wb') as f: f.write(b'x' * (1 << 20))\n"
                              "sys.stdout.write('done\\n'); sys.stdout.flush()\n"
                              "sys.stdin.read()\n"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdin is not None
        read = proc_reader(Path("/proc"))
        before = read(child.pid)
        assert child.stdout.readline() == b"done\n"
        after = read(child.pid)
        assert after["state"] in ("S", "R")
        assert after["cpu_s"] >= 0.25 and after["cpu_s"] >= before.get("cpu_s", 0.0)
        assert after["written"] - before.get("written", 0) >= 1 << 20
        owner = {"pid": child.pid, "job": "j", **after}
        section = {"flows": [], "omitted": 0, "tracked": 0, "map_full": 0, "drops": {},
                   "drops_delta": {}, "owners": [owner]}
        assert validate_section("tcp_flows", section)["owners"] == [owner]
    finally:
        child.stdin.close()
        child.wait()
    assert read(child.pid) == {"state": "X"}


def test_top_flows_by_activity_and_omitted_count(capture: dict[str, Any],
                                                 fixtures: Path) -> None:
    meta = capture["meta"]
    s1 = replay(reporter(fixtures, max_report_flows=1), capture)[0]
    [top] = s1.section["flows"]
    assert s1.section["omitted"] == 1 and s1.section["tracked"] == 2
    # server: first + 1 bytes read, 2 acked; client: first acked, 2 read
    assert (top["sport"], top["dport"]) == (meta["port"], meta["client_port"])
    assert top["bytes_received_delta"] + top["bytes_acked_delta"] == meta["first"] + 3


def test_owner_filter_hides_flows_with_unknown_owner(capture: dict[str, Any],
                                                     fixtures: Path) -> None:
    raw = snapshot(capture["snapshots"][0])
    sk_client = next(sk for sk, v in raw.live.items()
                     if FlowEntry.decode(v).sport == capture["meta"]["client_port"])
    rep = reporter(fixtures, pids=[capture["meta"]["pid"]])
    entry = FlowEntry.decode(raw.live[sk_client])
    assert entry.owner_known
    # the same flow as the kernel holds it before its owner was seen: first 8 bytes are
    # first_ns, owner_known is the 3rd of the 5 flag bytes after the u16 fields
    unknown = bytearray(raw.live[sk_client])
    unknown[5 * 8 + 14 * 4 + 3 * 2 + 2] = 0
    assert not FlowEntry.decode(bytes(unknown)).owner_known
    assert entry._replace(owner_known=0) == FlowEntry.decode(bytes(unknown))
    raw.live[sk_client] = bytes(unknown)
    sec = rep.report(raw, 1.0).section
    assert sec["unattributed"] == 1 and len(sec["flows"]) == 1


def test_events_are_capped(capture: dict[str, Any], fixtures: Path) -> None:
    raw = snapshot(capture["snapshots"][-1])
    assert len(raw.events) == 2
    sample = reporter(fixtures, max_events=1).report(raw, 1.0)
    assert len(sample.events) == 1 and sample.section["events_suppressed"] == 1


def test_decode_event_unknown_type_is_skipped(capture: dict[str, Any]) -> None:
    rec = bytearray(bytes.fromhex(capture["snapshots"][-1]["events"][0]))
    rec[8 + 3 * 4 + 3 * 2] = 99  # the type byte
    assert decode_event(bytes(rec), {}) is None


def test_drop_counts_names_and_other_slot() -> None:
    names = {12: "NETFILTER_DROP", 3: "NO_SOCKET"}
    assert drop_counts({12: 5, 3: 0, 200: 2, 255: 7}, names) == {
        "NETFILTER_DROP": 5, "REASON_200": 2, "OTHER": 7}


def test_drops_delta_between_reports(capture: dict[str, Any], fixtures: Path) -> None:
    samples = replay(reporter(fixtures), capture)
    totals = [s.section["drops"] for s in samples]
    deltas = [s.section["drops_delta"] for s in samples]
    assert deltas[0] == totals[0]
    for prev, cur, delta in zip(totals, totals[1:], deltas[1:]):
        assert delta == {k: v - prev.get(k, 0) for k, v in cur.items() if v != prev.get(k, 0)}
    assert totals[-1].get("NO_SOCKET", 0) >= 1  # the refused SYN


# ------------------------------------------- changed-only reporting and the periodic refresh

def sk_of(snap: Snapshot, sport: int) -> int:
    return next(sk for sk, v in snap.live.items() if FlowEntry.decode(v).sport == sport)


def without_rates(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if not k.endswith(("_delta", "_rate"))}


def test_unchanged_flows_are_counted_not_listed(capture: dict[str, Any],
                                                fixtures: Path) -> None:
    rep = reporter(fixtures)
    first = rep.report(snapshot(capture["snapshots"][0]), 1.0).section
    assert first["refresh"] and len(first["flows"]) == 2 and first["unchanged"] == 0
    again = rep.report(snapshot(capture["snapshots"][0]), 1.0).section  # nothing moved
    assert again["flows"] == [] and not again["refresh"]
    assert (again["unchanged"], again["tracked"], again["omitted"]) == (2, 2, 0)


def test_only_the_flow_that_moved_is_listed(capture: dict[str, Any], fixtures: Path) -> None:
    meta = capture["meta"]
    s1, s2 = (snapshot(raw) for raw in capture["snapshots"][:2])
    server = sk_of(s1, meta["port"])
    s2.live[server] = s1.live[server]  # the server's entry as before: only the client moved
    rep = reporter(fixtures)
    rep.report(s1, 1.0)
    sec = rep.report(s2, 0.5).section
    [row] = sec["flows"]
    assert (row["sport"], row["dport"]) == (meta["client_port"], meta["port"])
    assert row["bytes_acked_delta"] == meta["second"] + 1
    assert row["bytes_acked_rate"] == pytest.approx((meta["second"] + 1) / 0.5)
    assert sec["unchanged"] == 1


def test_refresh_lists_every_flow_with_zero_deltas(capture: dict[str, Any],
                                                   fixtures: Path) -> None:
    rep = reporter(fixtures, refresh_intervals=3)
    secs = [rep.report(snapshot(capture["snapshots"][0]), 1.0).section for _ in range(7)]
    assert [s["refresh"] for s in secs] == [True, False, False, True, False, False, True]
    assert [len(s["flows"]) for s in secs] == [2, 0, 0, 2, 0, 0, 2]
    assert [s["unchanged"] for s in secs] == [0, 2, 2, 0, 2, 2, 0]
    first = {(f["sport"], f["dport"]): f for f in secs[0]["flows"]}
    for row in secs[3]["flows"]:
        assert without_rates(row) == without_rates(first[(row["sport"], row["dport"])])
        assert row["bytes_acked_delta"] == row["bytes_received_delta"] == 0
        assert row["bytes_acked_rate"] == row["bytes_received_rate"] == 0


def test_omitted_flow_is_listed_next_time_even_if_idle(capture: dict[str, Any],
                                                       fixtures: Path) -> None:
    raw = capture["snapshots"][0]
    rep = reporter(fixtures, max_report_flows=1)
    first, second, third = (rep.report(snapshot(raw), 1.0).section for _ in range(3))
    assert (first["omitted"], second["omitted"]) == (1, 0)
    [a], [b] = first["flows"], second["flows"]
    assert {(a["sport"], a["dport"]), (b["sport"], b["dport"])} == {
        (capture["meta"]["port"], capture["meta"]["client_port"]),
        (capture["meta"]["client_port"], capture["meta"]["port"])}
    assert b["bytes_acked"] + b["bytes_received"] > 0  # its totals get through ...
    assert b["bytes_acked_delta"] == b["bytes_received_delta"] == 0  # ... it was idle since
    assert third["flows"] == [] and third["unchanged"] == 2


def test_reused_socket_address_is_a_new_flow(capture: dict[str, Any], fixtures: Path) -> None:
    rep = reporter(fixtures)
    rep.report(snapshot(capture["snapshots"][0]), 1.0)
    snap = snapshot(capture["snapshots"][0])
    sk = sk_of(snap, capture["meta"]["port"])
    e = FlowEntry.decode(snap.live[sk])
    snap.live[sk] = FLOW_LAYOUT.pack(*e._replace(first_ns=e.first_ns + 1))
    [row] = rep.report(snap, 1.0).section["flows"]
    assert row["bytes_received_delta"] == row["bytes_received"] == e.bytes_received > 0


@pytest.mark.parametrize("moved", [False, True], ids=["idle", "moved"])
def test_flow_in_both_maps_is_listed_once_as_closed(capture: dict[str, Any], fixtures: Path,
                                                    moved: bool) -> None:
    snaps = [snapshot(raw) for raw in capture["snapshots"]]
    rep = reporter(fixtures)
    close = next(i for i, raw in enumerate(capture["snapshots"]) if raw["label"] == "after close")
    for s in snaps[:close - 1]:
        rep.report(s, 1.0)
    if not moved:
        rep.report(snaps[close - 1], 1.0)
    snaps[close].live = dict(snaps[close - 1].live)  # the flows map read just before the close
    sec = rep.report(snaps[close], 1.0).section
    assert len(sec["flows"]) == 2 and all(f["closed"] for f in sec["flows"])
    assert (sec["tracked"], sec["unchanged"]) == (2, 0)
    assert rep.report(snaps[close + 1], 1.0).section["flows"] == []


def test_owner_seen_later_updates_the_row(capture: dict[str, Any], fixtures: Path) -> None:
    meta = capture["meta"]
    snap = snapshot(capture["snapshots"][0])
    server = sk_of(snap, meta["port"])
    e = FlowEntry.decode(snap.live[server])
    early = snapshot(capture["snapshots"][0])  # before the accepted socket's first recv
    early.live[server] = FLOW_LAYOUT.pack(*e._replace(pid=0, comm_raw=bytes(16)))
    rep = reporter(fixtures, netns=77)
    before = by_ports(rep.report(early, 1.0), meta["port"], meta["client_port"])
    assert (before["pid"], before["comm"], before["netns"]) == (0, "", 0)
    [after] = rep.report(snap, 1.0).section["flows"]
    assert (after["pid"], after["comm"], after["netns"]) == (meta["pid"], meta["comm"], 77)
    assert after["bytes_received_delta"] == 0


def test_hot_layout_reads_the_same_fields(capture: dict[str, Any]) -> None:
    distinct = FlowEntry._make(
        [bytes([i]) * 16 if isinstance(v, bytes) else i
         for i, v in enumerate(FlowEntry.decode(bytes(FLOW_LAYOUT.size)), start=1)])
    raws = [FLOW_LAYOUT.pack(*distinct)] + [
        bytes.fromhex(v) for s in capture["snapshots"]
        for v in [*s["live"].values(), *(c for _, c in s["closed"])]]
    for raw in raws:
        e = FlowEntry.decode(raw)
        assert HOT_LAYOUT.unpack(raw) == tuple(getattr(e, name) for name in HOT_FIELDS)
