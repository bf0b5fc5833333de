"""Fixtures shared by the root tests (the lab's: tests/root/_lab.py)."""
from ._lab import lab, ring, steady  # noqa: F401 (pytest fixtures)
