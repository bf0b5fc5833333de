"""The per-host c4 agent: collectors -> reports -> wire -> aggregator."""
