"""Collector registry. Modules are imported only when enabled, so a host without BCC or
pyverbs runs the other collectors."""
from __future__ import annotations

import importlib

from c4.core.catalog import COLLECTORS

from .base import Collector, CollectorUnavailable, Context, Event, OptionError, Sample

# name -> "module:Class", by the naming rule stated with COLLECTORS in c4/core/catalog.py.
REGISTRY: dict[str, str] = {
    n: f"{__name__}.{n}:{''.join(w.capitalize() for w in n.split('_'))}Collector" for n in COLLECTORS}
DEFAULT_ENABLED = COLLECTORS


def load(name: str) -> type[Collector]:
    try:
        target = REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown collector {name!r}; known: {', '.join(REGISTRY)}") from None
    module, cls = target.split(":")
    found: type[Collector] = getattr(importlib.import_module(module), cls)
    return found


__all__ = ["Collector", "CollectorUnavailable", "Context", "Event", "OptionError", "Sample",
           "REGISTRY", "DEFAULT_ENABLED", "load"]
