"""c4.core: the bottom layer shared by agent, aggregator, CLI and lab: wire format, config,
recordings, topology, the catalog of counters and names. It imports nothing of c4 above it."""
