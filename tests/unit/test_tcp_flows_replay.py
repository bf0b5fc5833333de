"""Decoding and per-interval logic on map entries captured from the real program
(tests/fixtures/tcp_flows/capture.py: a scripted loopback exchange, one snapshot per step)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.collectors.tcp_flows import (
    FlowEntry, Reporter, Snapshot, decode_event, detect_features, drop_counts, parse_options,
)
from c4.wire.kinds import validate_body


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


def test_deltas_then_closed_once_then_forgotten(capture: dict[str, Any], fixtures: Path) -> None:
    meta = capture["meta"]
    cport, port = meta["client_port"], meta["port"]
    samples = replay(reporter(fixtures), capture)
    s1, s2, closed, after, refused = samples

    c1, c2 = by_ports(s1, cport, port), by_ports(s2, cport, port)
    assert c1["bytes_acked_delta"] == c1["bytes_acked"] == meta["first"]  # new this interval
    assert c2["bytes_acked_delta"] == meta["second"] + 1
    assert by_ports(s2, port, cport)["bytes_received_delta"] == meta["second"] + 1
    interval = capture["snapshots"][1]["t"] - capture["snapshots"][0]["t"]
    assert c2["bytes_acked_rate"] == pytest.approx((meta["second"] + 1) / interval)
    assert c2["netns"] == 4026531840 and c2["closed"] is False

    done = {(f["sport"], f["dport"]): f for f in closed.section["flows"]}
    assert set(done) == {(cport, port), (port, cport)}
    assert all(f["closed"] and f["state"] == "CLOSE" for f in done.values())
    assert done[(cport, port)]["bytes_acked_delta"] == 0  # nothing moved since s2
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
        validate_body("report", {"interval": 1.0, "health": {}, "tcp_flows": s.section})
        for e in s.events:
            validate_body("event", e.body())


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
    unknown[5 * 8 + 11 * 4 + 3 * 2 + 2] = 0
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
