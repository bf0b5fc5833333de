"""Placeholder: filled in by the collector's issue."""
from __future__ import annotations

from ..schema import Record

SECTION: Record | None = None
EVENTS: dict[str, Record] = {}
