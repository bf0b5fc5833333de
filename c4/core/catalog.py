"""Names and units of the RDMA port counters (sysfs `counters/` and `hw_counters/`), shared by
the agent that reads and exports them and the aggregator that can re-export them on /metrics.

Metric names, labels and units are node_exporter's infiniband collector's (v1.11+, which added
the mlx5 `hw_counters`): prometheus/node_exporter collector/infiniband_linux.go with
prometheus/procfs sysfs/class_infiniband.go, so dashboards and alerts written for node_exporter
work on c4's data unchanged."""
from __future__ import annotations

# sysfs counter file -> node_exporter's infiniband collector metric, so /metrics keeps the
# names dashboards already use. Multiply by COUNTER_SCALE (if listed) to get the unit.
NODE_EXPORTER_METRICS: dict[str, str] = {
    "excessive_buffer_overrun_errors": "node_infiniband_excessive_buffer_overrun_errors_total",
    "link_downed": "node_infiniband_link_downed_total",
    "link_error_recovery": "node_infiniband_link_error_recovery_total",
    "local_link_integrity_errors": "node_infiniband_local_link_integrity_errors_total",
    "multicast_rcv_packets": "node_infiniband_multicast_packets_received_total",
    "multicast_xmit_packets": "node_infiniband_multicast_packets_transmitted_total",
    "port_rcv_constraint_errors": "node_infiniband_port_constraint_errors_received_total",
    "port_xmit_constraint_errors": "node_infiniband_port_constraint_errors_transmitted_total",
    "port_rcv_data": "node_infiniband_port_data_received_bytes_total",
    "port_xmit_data": "node_infiniband_port_data_transmitted_bytes_total",
    "port_rcv_discards": "node_infiniband_port_discards_received_total",
    "port_xmit_discards": "node_infiniband_port_discards_transmitted_total",
    "port_rcv_errors": "node_infiniband_port_errors_received_total",
    "port_rcv_packets": "node_infiniband_port_packets_received_total",
    "port_xmit_packets": "node_infiniband_port_packets_transmitted_total",
    "port_xmit_wait": "node_infiniband_port_transmit_wait_total",
    "port_rcv_remote_physical_errors": "node_infiniband_port_receive_remote_physical_errors_total",
    "port_rcv_switch_relay_errors": "node_infiniband_port_receive_switch_relay_errors_total",
    "symbol_error": "node_infiniband_symbol_error_total",
    "unicast_rcv_packets": "node_infiniband_unicast_packets_received_total",
    "unicast_xmit_packets": "node_infiniband_unicast_packets_transmitted_total",
    "VL15_dropped": "node_infiniband_vl15_dropped_total",
    # hw_counters/ (mlx5 RoCE): congestion (ECN, CNP), retransmits, QP errors
    "duplicate_request": "node_infiniband_duplicate_requests_packets_total",
    "implied_nak_seq_err": "node_infiniband_implied_nak_seq_errors_total",
    "local_ack_timeout_err": "node_infiniband_local_ack_timeout_errors_total",
    "np_cnp_sent": "node_infiniband_np_cnp_packets_sent_total",
    "np_ecn_marked_roce_packets": "node_infiniband_np_ecn_marked_roce_packets_received_total",
    "out_of_buffer": "node_infiniband_out_of_buffer_drops_total",
    "out_of_sequence": "node_infiniband_out_of_sequence_packets_received_total",
    "packet_seq_err": "node_infiniband_packet_sequence_errors_total",
    "req_cqe_error": "node_infiniband_req_cqes_errors_total",
    "req_cqe_flush_error": "node_infiniband_req_cqes_flush_errors_total",
    "req_remote_access_errors": "node_infiniband_req_remote_access_errors_total",
    "req_remote_invalid_request": "node_infiniband_req_remote_invalid_request_errors_total",
    "resp_cqe_error": "node_infiniband_resp_cqes_errors_total",
    "resp_cqe_flush_error": "node_infiniband_resp_cqes_flush_errors_total",
    "resp_local_length_error": "node_infiniband_resp_local_length_errors_total",
    "resp_remote_access_errors": "node_infiniband_resp_remote_access_errors_total",
    "rnr_nak_retry_err": "node_infiniband_rnr_nak_retry_packets_received_total",
    "roce_adp_retrans": "node_infiniband_roce_adp_retransmits_total",
    "roce_adp_retrans_to": "node_infiniband_roce_adp_retransmits_timeout_total",
    "roce_slow_restart": "node_infiniband_roce_slow_restart_used_total",
    "roce_slow_restart_cnps": "node_infiniband_roce_slow_restart_cnps_total",
    "roce_slow_restart_trans": "node_infiniband_roce_slow_restart_total",
    "rp_cnp_handled": "node_infiniband_rp_cnp_packets_handled_total",
    "rp_cnp_ignored": "node_infiniband_rp_cnp_ignored_packets_received_total",
    "rx_atomic_requests": "node_infiniband_rx_atomic_requests_total",
    "rx_dct_connect": "node_infiniband_rx_dct_connect_requests_total",
    "rx_icrc_encapsulated": "node_infiniband_rx_icrc_encapsulated_errors_total",
    "rx_read_requests": "node_infiniband_rx_read_requests_total",
    "rx_write_requests": "node_infiniband_rx_write_requests_total",
}
# Counters node_exporter does not export (other drivers' hw_counters): one family keyed by the
# sysfs name, so nothing the NIC counts is lost and no name clashes with node_exporter's.
OTHER_COUNTER_METRIC = "c4_rdma_port_other_total"
# The data counters count 4-octet words (IBTA PortCounters PortXmitData/PortRcvData).
COUNTER_SCALE: dict[str, int] = {"port_xmit_data": 4, "port_rcv_data": 4}

# The gauges of the same collector (its `lifespan_seconds` is not a port property: the agent
# does not read `hw_counters/lifespan`).
STATE_METRIC = "node_infiniband_state_id"
PHYS_STATE_METRIC = "node_infiniband_physical_state_id"
RATE_METRIC = "node_infiniband_rate_bytes_per_second"
INFO_METRIC = "node_infiniband_info"  # labels device, board_id, firmware_version, hca_type
# sysfs prints "4: ACTIVE" and "5: LinkUp"; the agent keeps the names, the IDs are the numbers
# (IBTA PortInfo PortState and PortPhysicalState).
PORT_STATE_IDS: dict[str, int] = {"NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4,
                                  "ACTIVE_DEFER": 5}
PHYS_STATE_IDS: dict[str, int] = {"NOP": 0, "Sleep": 1, "Polling": 2, "Disabled": 3,
                                  "PortConfigurationTraining": 4, "LinkUp": 5,
                                  "LinkErrorRecovery": 6, "Phy Test": 7}
# rate "100 Gb/sec (4X EDR)" -> bytes/s, as procfs parseRate does.
BYTES_PER_GBIT = 125_000_000

# --- the rest of the vocabulary: one definition each, imported by agent, aggregator, CLI, lab.

# Agent collectors, in report order. Each name is also the report section and wire module
# (c4/core/wire/sections/<name>.py) and the agent module c4/agent/collectors/<name>.py, whose
# class is the CamelCase name + "Collector" (tcp_flows -> TcpFlowsCollector).
COLLECTORS: tuple[str, ...] = ("host", "rdma", "pfc", "kmsg", "tcp_flows", "verbs_qp", "nccl")

# The RoCE hw_counters that carry network symptoms, and which end of a flow counts them: the
# receiver's NIC counts ECN-marked packets, the CNPs it sends back and out-of-order arrivals;
# the sender's NIC counts the CNPs it handles and its ACK timeouts (retransmits).
ROCE_SIGNALS: dict[str, tuple[str, str, str]] = {
    # sysfs name: (end of the flow that counts it, symptom, column label for people)
    "np_ecn_marked_roce_packets": ("rx", "congestion", "ECN/s"),
    "np_cnp_sent": ("rx", "congestion", "CNP tx/s"),
    "rp_cnp_handled": ("tx", "congestion", "CNP rx/s"),
    "out_of_sequence": ("rx", "loss", "OOS/s"),
    "packet_seq_err": ("tx", "loss", "seq err/s"),  # NAKs for out-of-order data, counted by the requester
    "local_ack_timeout_err": ("tx", "loss", "timeout/s"),
}
ROCE_RX = tuple(n for n, (end, _, _) in ROCE_SIGNALS.items() if end == "rx")
ROCE_TX = tuple(n for n, (end, _, _) in ROCE_SIGNALS.items() if end == "tx")

# C4D incident classes. When symptoms of one fault meet in one incident, the lowest rank (the
# most specific explanation) names it.
INCIDENT_CLASSES: dict[str, int] = {
    "hw_xid": 0, "hw_nic_down": 0, "hw_link_flap": 0, "hw_pfc_storm": 0, "hw_aer": 0,
    "host_silent": 1, "comm_hang": 2, "noncomm_hang": 2, "comm_slow": 3, "noncomm_slow": 3,
}
# Suspect kinds an action may drain: a fabric link or a path is not a node, and draining an
# endpoint for it would isolate a healthy host.
DRAINABLE_KINDS = ("host", "nic", "gpu", "rank")
