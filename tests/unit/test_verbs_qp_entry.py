"""Decoding eBPF map entries into the wire form of a QP, and the section schema."""
from __future__ import annotations

from dataclasses import replace

import pytest

from c4.agent.collectors.verbs_qp import (IBV_QP_AV, IBV_QP_DEST_QPN, IBV_QP_PORT, RawQp,
                                       format_gid, qp_entry)
from c4.core.roce import rdma_flow_label_to_udp_sport
from c4.core.wire.kinds import validate_body
from c4.core.wire.schema import Invalid

DGID = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 2])  # RoCEv2 GID of 10.0.0.2
# an NCCL RC QP after INIT (port 1) and RTR (dest 0x423c, flow label 0) -> RTS
NCCL_RC = RawQp(pid=4242, qpn=0x1FD2, comm=b"python\0\0\0\0\0\0\0\0\0\0", qp_type=2, state=3,
                dest_qpn=0x423C, flow_label=0, known=IBV_QP_PORT | IBV_QP_AV | IBV_QP_DEST_QPN,
                port=1, ah_port=2, dgid=DGID, modifies=3, modify_failed=0, destroyed=False)


def test_rc_qp_gets_the_kernel_source_port() -> None:
    e = qp_entry(NCCL_RC)
    assert e == {"pid": 4242, "comm": "python", "lqpn": 0x1FD2, "rqpn": 0x423C,
                 "qp_type": "RC", "state": "RTS", "port": 1,
                 "dgid": "0000:0000:0000:0000:0000:ffff:0a00:0002", "flow_label": 0,
                 "sport": 55701, "destroyed": False, "modifies": 3, "modify_failed": 0}


def test_flow_label_set_by_the_application_decides_the_port() -> None:
    e = qp_entry(replace(NCCL_RC, flow_label=0x12345))
    assert e["sport"] == rdma_flow_label_to_udp_sport(0x12345) != 55701


@pytest.mark.parametrize("change", [
    {"known": IBV_QP_PORT | IBV_QP_AV},  # no remote QP number yet
    {"dgid": bytes(16)},  # no GRH: InfiniBand, no UDP header
    {"qp_type": 4},  # UD: one QP talks to many peers
])
def test_no_port_without_what_the_kernel_needs(change: dict) -> None:
    assert qp_entry(replace(NCCL_RC, **change))["sport"] is None


def test_fields_whose_mask_bit_was_never_set_are_unknown() -> None:
    e = qp_entry(replace(NCCL_RC, known=0, state=0))
    assert (e["rqpn"], e["port"], e["dgid"], e["flow_label"], e["state"]) == (
        None, None, None, None, "RESET")


def test_port_falls_back_to_the_address_vector() -> None:
    assert qp_entry(replace(NCCL_RC, known=IBV_QP_AV))["port"] == 2


def test_unknown_enum_values_are_named_unknown() -> None:
    e = qp_entry(replace(NCCL_RC, qp_type=77, state=9))
    assert (e["qp_type"], e["state"]) == ("UNKNOWN", "UNKNOWN")


def test_process_exit_counts_as_destroyed() -> None:
    e = qp_entry(NCCL_RC, exited=True)
    assert e["destroyed"] is True and e["exited"] is True
    assert "exited" not in qp_entry(replace(NCCL_RC, destroyed=True))


def test_gid_text_form() -> None:
    assert format_gid(bytes(range(16))) == "0001:0203:0405:0607:0809:0a0b:0c0d:0e0f"


def _section(qps: list) -> dict:
    stats = dict.fromkeys(("creates", "create_failed", "modifies", "modify_failed", "destroys",
                           "destroy_failed", "map_full", "unreported", "read_failed",
                           "netlink_errors", "netlink_rejected"), 0)
    return {"qps": qps, "live": len(qps), "deferred": 0, "stats": stats}


def test_section_validates_in_a_report() -> None:
    qps = [qp_entry(NCCL_RC), qp_entry(replace(NCCL_RC, known=0, qpn=5), exited=True)]
    body = validate_body("report", {"interval": 1.0, "health": {}, "verbs_qp": _section(qps)})
    assert body["verbs_qp"]["qps"][0]["sport"] == 55701


@pytest.mark.parametrize("field,value", [("sport", 80), ("state", "BROKEN"), ("dgid", "::1")])
def test_section_rejects_impossible_values(field: str, value: object) -> None:
    qp = {**qp_entry(NCCL_RC), field: value}
    with pytest.raises(Invalid, match=field):
        validate_body("report", {"interval": 1.0, "health": {}, "verbs_qp": _section([qp])})
