"""Checking what a collector produces against the wire schemas, as the aggregator will."""
from __future__ import annotations

from typing import Any

from c4.agent.collectors.base import Sample
from c4.core.wire import kinds


def validate_section(name: str, section: Any) -> Any:
    """`section` as report.body[name]; returns it validated (raises wire.Invalid)."""
    return kinds.validate_body("report", {"interval": 1.0, "health": {}, name: section})[name]


def validate_sample(name: str, sample: Sample) -> Any:
    """A collector's whole Sample: its section in a report and each event in an event frame."""
    for ev in sample.events:
        kinds.validate_body("event", ev.body())
    return validate_section(name, sample.section)
