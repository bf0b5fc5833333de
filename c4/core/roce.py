"""RoCEv2 UDP source port of a QP, computed exactly as the Linux kernel does.

RoCEv2 fabrics hash the UDP 5-tuple for ECMP, and the only part a host controls is the UDP
source port. mlx5 sets it at INIT->RTR (`include/rdma/ib_verbs.h`, `rdma_get_udp_sport`):
from the GRH flow label when the application set one, otherwise from a flow label derived
from the two QP numbers. NCCL leaves the flow label 0, so each NCCL QP's port is a function of
(lqpn, rqpn): the agent predicts it and the planner inverts it.
"""
from __future__ import annotations

FLOW_LABEL_MASK = 0xFFFFF  # 20-bit IPv6/GRH flow label
SPORT_BASE = 0xC000  # every derived port lies in 0xC000..0xFFFF
_U64 = (1 << 64) - 1


def rdma_calc_flow_label(lqpn: int, rqpn: int) -> int:
    """Kernel `rdma_calc_flow_label`: fold the 64-bit product of the QP numbers to 20 bits."""
    v = (lqpn * rqpn) & _U64
    v ^= v >> 20
    v ^= v >> 40
    return v & FLOW_LABEL_MASK


def rdma_flow_label_to_udp_sport(fl: int) -> int:
    """Kernel `rdma_flow_label_to_udp_sport`: fold 20 bits to 14 and set the two top bits."""
    fl_low = fl & 0x03FFF
    fl_high = fl & 0xFC000
    fl_low ^= fl_high >> 14
    return (fl_low | SPORT_BASE) & 0xFFFF


def sport_for_qp(lqpn: int, rqpn: int, flow_label: int) -> int:
    """UDP source port of an RC/UC QP: `rdma_get_udp_sport(flow_label, lqpn, rqpn)`."""
    # The kernel tests the raw u32 for zero before masking; so do we.
    fl = flow_label or rdma_calc_flow_label(lqpn, rqpn)
    return rdma_flow_label_to_udp_sport(fl)
