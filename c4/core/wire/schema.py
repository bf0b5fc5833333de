"""A small declarative schema language for wire bodies.

Every kind and every report section is described with these specs; decoding validates a
decoded msgpack value against its spec, in place (a valid value is returned as it is), and
raises `Invalid` with the path of the first bad field. The same specs render the field tables
in docs/wire.md (`describe`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = [
    "Invalid", "Spec", "Int", "Float", "Str", "Bool", "Enum", "List", "Map",
    "Record", "Nullable", "U32", "U64", "I64", "SEQ", "COUNTER", "SECONDS",
]


# A field's path is built as nested (parent, key) tuples and rendered as "a.b.0.c" only when
# a value is rejected: formatting a string per field on the success path doubled the cost of
# validating a report.
PathT = Any  # str | tuple[PathT, Any]


def render_path(path: PathT) -> str:
    parts: list[str] = []
    while isinstance(path, tuple):
        path, key = path
        parts.append(_short(str(key)))
    if path:
        parts.append(_short(str(path)))
    return ".".join(reversed(parts))


SHOWN = 48  # characters of a peer's value an error message quotes


def _short(text: str) -> str:
    return text if len(text) <= SHOWN else text[:SHOWN] + "..."


def show(value: Any) -> str:
    """A rejected value for an error message, bounded whatever the peer sent: a string's first
    characters, a number, else only its type (repr of a nested value can recurse ~1,000 deep)."""
    if isinstance(value, str):
        return repr(_short(value))
    if type(value) in (int, float, bool) or value is None:
        return repr(value)
    return f"a {_tname(value)}"


class Invalid(ValueError):
    """A value does not match its schema. `path` names the offending field."""

    def __init__(self, path: PathT, reason: str) -> None:
        self.path = render_path(path)
        self.reason = reason
        super().__init__(f"{self.path or '<root>'}: {reason}")


def _join(path: PathT, key: Any) -> PathT:
    return (path, key) if path != "" else key


class Spec:
    def check(self, value: Any, path: str = "") -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


def _tname(value: Any) -> str:
    return type(value).__name__


@dataclass(frozen=True)
class Int(Spec):
    min: int | None = None
    max: int | None = None

    def check(self, value: Any, path: str = "") -> int:
        if type(value) is not int:  # msgpack yields exact ints; bool is not a number here
            raise Invalid(path, f"expected integer, got {_tname(value)}")
        if self.min is not None and value < self.min:
            raise Invalid(path, f"{value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise Invalid(path, f"{value} is above the maximum {self.max}")
        return value

    def describe(self) -> str:
        lo = "" if self.min is None else str(self.min)
        hi = "" if self.max is None else str(self.max)
        return f"int [{lo}..{hi}]" if lo or hi else "int"


U32 = Int(0, 2**32 - 1)
U64 = Int(0, 2**64 - 1)
I64 = Int(-(2**63), 2**63 - 1)
# Sequence numbers are stored in SQLite INTEGER columns (signed 64-bit): a wider range on the
# wire would pass validation and then fail to store.
SEQ = Int(0, 2**63 - 1)
COUNTER = U64


@dataclass(frozen=True)
class Float(Spec):
    """A finite number; integers are accepted (msgpack encoders may shorten 2.0 to 2)."""

    min: float | None = None
    max: float | None = None

    def check(self, value: Any, path: str = "") -> float:
        if type(value) is not float and type(value) is not int:
            raise Invalid(path, f"expected number, got {_tname(value)}")
        if isinstance(value, float) and not math.isfinite(value):
            raise Invalid(path, "number is not finite")
        if self.min is not None and value < self.min:
            raise Invalid(path, f"{value} is below the minimum {self.min}")
        if self.max is not None and value > self.max:
            raise Invalid(path, f"{value} is above the maximum {self.max}")
        return value

    def describe(self) -> str:
        lo = "" if self.min is None else f"{self.min:g}"
        hi = "" if self.max is None else f"{self.max:g}"
        return f"number [{lo}..{hi}]" if lo or hi else "number"


SECONDS = Float(0.0, 1e12)


@dataclass(frozen=True)
class Str(Spec):
    max_len: int = 256
    pattern: str | None = None
    min_len: int = 0
    _match: Any = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.pattern is not None:  # compiled once: names are checked per counter per frame
            object.__setattr__(self, "_match", re.compile(self.pattern).fullmatch)

    def check(self, value: Any, path: str = "") -> str:
        if not isinstance(value, str):
            raise Invalid(path, f"expected string, got {_tname(value)}")
        if len(value) > self.max_len:
            raise Invalid(path, f"string longer than {self.max_len}")
        if len(value) < self.min_len:
            raise Invalid(path, f"string shorter than {self.min_len}")
        if self._match is not None and not self._match(value):
            raise Invalid(path, f"{show(value)} does not match {self.pattern}")
        return value

    def describe(self) -> str:
        extra = f", /{self.pattern}/" if self.pattern else ""
        return f"str (<= {self.max_len}{extra})"


@dataclass(frozen=True)
class Bool(Spec):
    def check(self, value: Any, path: str = "") -> bool:
        if not isinstance(value, bool):
            raise Invalid(path, f"expected bool, got {_tname(value)}")
        return value

    def describe(self) -> str:
        return "bool"


@dataclass(frozen=True)
class Enum(Spec):
    values: tuple[str, ...]

    def check(self, value: Any, path: str = "") -> str:
        if not isinstance(value, str) or value not in self.values:
            raise Invalid(path, f"{show(value)} is not one of {', '.join(self.values)}")
        return value

    def describe(self) -> str:
        return "one of " + ", ".join(f"`{v}`" for v in self.values)


@dataclass(frozen=True)
class Nullable(Spec):
    inner: Spec

    def check(self, value: Any, path: str = "") -> Any:
        return None if value is None else self.inner.check(value, path)

    def describe(self) -> str:
        return f"{self.inner.describe()} or nil"


@dataclass(frozen=True)
class List(Spec):
    item: Spec
    max_len: int = 1024
    min_len: int = 0

    def check(self, value: Any, path: str = "") -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise Invalid(path, f"expected array, got {_tname(value)}")
        if len(value) > self.max_len:
            raise Invalid(path, f"array longer than {self.max_len}")
        if len(value) < self.min_len:
            raise Invalid(path, f"array shorter than {self.min_len}")
        check = self.item.check
        for i, v in enumerate(value):
            check(v, _join(path, i))
        return value  # type: ignore[return-value]  # a tuple passes as an array, unchanged

    def describe(self) -> str:
        size = (f"{self.max_len}" if self.min_len == self.max_len
                else f"{self.min_len}..{self.max_len}" if self.min_len else f"<= {self.max_len}")
        return f"array ({size}) of {self.item.describe()}"


@dataclass(frozen=True)
class Map(Spec):
    key: Spec
    value: Spec
    max_len: int = 1024

    def check(self, value: Any, path: str = "") -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise Invalid(path, f"expected map, got {_tname(value)}")
        if len(value) > self.max_len:
            raise Invalid(path, f"map has more than {self.max_len} entries")
        kcheck, vcheck = self.key.check, self.value.check
        for k, v in value.items():
            kcheck(k, _join(path, "<key>"))
            vcheck(v, _join(path, k))
        return value

    def describe(self) -> str:
        return f"map (<= {self.max_len}) {self.key.describe()} -> {self.value.describe()}"


@dataclass(frozen=True)
class Record(Spec):
    """A map with known string keys. Unknown keys are rejected unless `open` (forward
    compatibility inside a major version is handled by listing new keys as optional)."""

    required: Mapping[str, Spec]
    optional: Mapping[str, Spec] = field(default_factory=dict)
    open: bool = False
    doc: Mapping[str, str] = field(default_factory=dict)

    def check(self, value: Any, path: str = "") -> dict[Any, Any]:
        if not isinstance(value, dict):
            raise Invalid(path, f"expected map, got {_tname(value)}")
        required = self.required
        for name, spec in required.items():
            if name not in value:
                raise Invalid(_join(path, name), "missing required field")
            spec.check(value[name], _join(path, name))
        if len(value) == len(required):
            return value
        for name, v in value.items():
            if name in required:
                continue
            opt = self.optional.get(name) if isinstance(name, str) else None
            if opt is not None:
                opt.check(v, _join(path, name))
            elif not self.open:  # open: validated by whoever knows its schema (event attrs)
                raise Invalid(_join(path, str(name)), "unknown field")
        return value

    def fields(self) -> list[tuple[str, Spec, bool]]:
        return [(n, s, True) for n, s in self.required.items()] + [
            (n, s, False) for n, s in self.optional.items()
        ]

    def describe(self) -> str:
        return "map (see fields)"


def describe_record(rec: Record, prefix: str = "") -> list[tuple[str, str, bool, str]]:
    """Flatten a record into (path, type, required, doc) rows for documentation."""
    rows: list[tuple[str, str, bool, str]] = []
    for name, spec, req in rec.fields():
        path = f"{prefix}.{name}" if prefix else name
        inner = spec.inner if isinstance(spec, Nullable) else spec
        if isinstance(inner, List) and isinstance(inner.item, Record):
            rows.append((path, f"array (<= {inner.max_len}) of map", req, rec.doc.get(name, "")))
            rows.extend(describe_record(inner.item, path + "[]"))
        elif isinstance(inner, Map) and isinstance(inner.value, Record):
            rows.append((path, f"map (<= {inner.max_len}) {inner.key.describe()} -> map", req,
                         rec.doc.get(name, "")))
            rows.extend(describe_record(inner.value, path + "{}"))
        elif isinstance(inner, Record):
            rows.append((path, "map", req, rec.doc.get(name, "")))
            rows.extend(describe_record(inner, path))
        else:
            rows.append((path, spec.describe(), req, rec.doc.get(name, "")))
    return rows
