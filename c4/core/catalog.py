"""Names and units of the RDMA port counters (sysfs `counters/`), shared by the agent that reads
them and the aggregator that exports them on /metrics."""
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
}
# The data counters count 4-octet words (IBTA PortCounters PortXmitData/PortRcvData).
COUNTER_SCALE: dict[str, int] = {"port_xmit_data": 4, "port_rcv_data": 4}
