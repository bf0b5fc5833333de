"""Validating a collector's options table (`[collectors.<name>]` in the agent TOML).

Each helper raises OptionError naming the full key, so a typo stops the agent with a line
that says which key and why, instead of a collector quietly running with a default.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from .base import OptionError


def check_keys(collector: str, options: Mapping[str, Any], known: Iterable[str]) -> None:
    known = sorted(known)
    for key in options:
        if key not in known:
            raise OptionError(f"collectors.{collector}.{key}: unknown option; known: "
                              f"{', '.join(known) or '(none)'}")


def get_bool(collector: str, options: Mapping[str, Any], key: str, default: bool) -> bool:
    value = options.get(key, default)
    if not isinstance(value, bool):
        raise OptionError(f"collectors.{collector}.{key}: expected true or false, got {value!r}")
    return value


def get_int(collector: str, options: Mapping[str, Any], key: str, default: int,
            lo: int, hi: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise OptionError(f"collectors.{collector}.{key}: expected an integer in "
                          f"[{lo}, {hi}], got {value!r}")
    return value


def get_str_list(collector: str, options: Mapping[str, Any], key: str) -> list[str] | None:
    """A list of non-empty strings, or None when the key is absent."""
    if key not in options:
        return None
    value = options[key]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise OptionError(f"collectors.{collector}.{key}: expected a list of names, "
                          f"got {value!r}")
    return list(value)


def get_int_map(collector: str, options: Mapping[str, Any], key: str, lo: int,
                hi: int) -> dict[str, int]:
    """A table name -> integer in [lo, hi]; empty when absent."""
    value = options.get(key, {})
    if not isinstance(value, dict):
        raise OptionError(f"collectors.{collector}.{key}: expected a table, got {value!r}")
    for name, v in value.items():
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise OptionError(f"collectors.{collector}.{key}.{name}: expected an integer in "
                              f"[{lo}, {hi}], got {v!r}")
    return dict(value)
