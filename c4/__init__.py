"""c4: shared pieces of the agent and the aggregator (wire format, config, CLI)."""
__version__ = "0.1.0"
