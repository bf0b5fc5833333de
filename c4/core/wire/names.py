"""Name types shared by several sections and kinds: one definition each."""
from __future__ import annotations

from .schema import Str

# A device, netdev, PCI address, boot id or collector name: kernel and udev names, never paths.
IDENT = Str(64, r"[A-Za-z0-9_.:\-]+")
# A counter file under sysfs `counters/` or `hw_counters/` (the agent skips any other name).
COUNTER_NAME = Str(96, r"[A-Za-z0-9_]+")
