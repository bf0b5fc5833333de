"""Report sections and event types, one module per agent collector.

Each module defines `SECTION` (the schema of `report.body[<name>]`, or None if the collector
only emits events) and `EVENTS` (event type -> schema of `event.body.attrs`).  The module name
is the collector name and the report key.
"""
from __future__ import annotations

import importlib
from types import ModuleType

from ...catalog import COLLECTORS
from ..schema import Record

NAMES = COLLECTORS


def _load() -> list[ModuleType]:
    return [importlib.import_module(f"{__name__}.{n}") for n in NAMES]


MODULES = _load()
SECTIONS = {m.__name__.rsplit(".", 1)[1]: m.SECTION for m in MODULES if m.SECTION is not None}
EVENTS: dict[str, Record] = {}
for _m in MODULES:
    for _type, _spec in _m.EVENTS.items():
        if _type in EVENTS:
            raise RuntimeError(f"event type {_type} defined twice")
        EVENTS[_type] = _spec
