"""Collector registry. Modules are imported only when enabled, so a host without BCC or
pyverbs runs the other collectors."""
from __future__ import annotations

import importlib

from .base import Collector, CollectorUnavailable, Context, Event, OptionError, Sample

# name -> "module:Class". The name is also the report section (c4/core/wire/sections/<name>.py).
REGISTRY: dict[str, str] = {
    "host": "c4.agent.collectors.host:HostCollector",
    "rdma": "c4.agent.collectors.rdma:RdmaCollector",
    "pfc": "c4.agent.collectors.pfc:PfcCollector",
    "kmsg": "c4.agent.collectors.kmsg:KmsgCollector",
    "tcp_flows": "c4.agent.collectors.tcp_flows:TcpFlowsCollector",
    "verbs_qp": "c4.agent.collectors.verbs_qp:VerbsQpCollector",
    "nccl": "c4.agent.collectors.nccl:NcclCollector",
}
DEFAULT_ENABLED = ("host", "rdma", "pfc", "kmsg", "tcp_flows", "verbs_qp", "nccl")


def load(name: str) -> type[Collector]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown collector {name!r}; known: {', '.join(REGISTRY)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


__all__ = ["Collector", "CollectorUnavailable", "Context", "Event", "OptionError", "Sample",
           "REGISTRY", "DEFAULT_ENABLED", "load"]
