"""c4: eBPF/RDMA observability agent and aggregator. Layers: c4.core (wire, config, topology,
catalog) <- c4.agent, c4.aggregator <- c4.cli, c4.lab."""
__version__ = "0.1.0"
