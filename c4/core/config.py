"""TOML configuration shared by the agent and the aggregator.

Each section is a dataclass whose fields carry their documentation (`doc` metadata); the same
metadata renders docs/config.md, and unknown or mistyped keys are errors that name the key.
"""
from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path
from typing import Any, Mapping, TypeVar


class ConfigError(ValueError):
    """A configuration problem; the message names the file and key."""


def field(default: Any, doc: str, **kw: Any) -> Any:
    if isinstance(default, (list, dict)):
        factory: Any = lambda d=default: type(d)(d)  # noqa: E731  # each instance its own copy
        return dataclasses.field(default_factory=factory, metadata={"doc": doc}, **kw)
    return dataclasses.field(default=default, metadata={"doc": doc}, **kw)


T = TypeVar("T")


def _coerce(where: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(where, args[0], value)
    if tp is Any:
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is Path:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a path string, got {value!r}")
        return Path(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(f"{where}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        _, vt = typing.get_args(tp)
        return {k: _coerce(f"{where}.{k}", vt, v) for k, v in value.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return build(tp, value, where)
    raise TypeError(f"unsupported config type {tp!r} at {where}")


def build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    kwargs = {k: _coerce(f"{where}.{k}" if where else k, hints[k], v) for k, v in data.items()}
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        check(where)
    return obj


def load(cls: type[T], path: str | Path | None) -> T:
    """Load `path` (None: all defaults) into dataclass `cls`."""
    if path is None:
        return build(cls, {}, "")
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    try:
        return build(cls, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{p}: {exc}") from None


def describe(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, doc) rows for docs/config.md."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, f"{key}."))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
        rows.append((key, name, default, f.metadata.get("doc", "")))
    return rows
