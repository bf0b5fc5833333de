"""JSON with line numbers: `loads` returns plain dicts and lists, except that every object is a
`PosDict` that knows the line of its `{` and of each of its keys, and every array a `PosList`
that knows its `[`. `c4 topology check` uses them to say where a problem is."""
from __future__ import annotations

import json
from typing import Any

_WS = " \t\n\r"
_scalar = json.JSONDecoder().raw_decode


class PosDict(dict[str, Any]):
    line: int = 0
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


class PosList(list[Any]):
    line: int = 0


def line_of(obj: Any, key: str | None = None) -> int | None:
    """Line of `obj` (or of `obj[key]`), None for values that carry no position."""
    if isinstance(obj, PosDict):
        return obj.line_of(key) if key is not None else obj.line
    return obj.line if isinstance(obj, PosList) else None


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        # line starts, to turn an offset into a line number by bisection
        self.starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]

    def line(self, i: int) -> int:
        lo, hi = 0, len(self.starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.starts[mid] <= i:
                lo = mid
            else:
                hi = mid
        return lo + 1

    def skip(self, i: int) -> int:
        while i < len(self.s) and self.s[i] in _WS:
            i += 1
        return i

    def error(self, msg: str, i: int) -> json.JSONDecodeError:
        return json.JSONDecodeError(msg, self.s, min(i, len(self.s)))

    def value(self, i: int) -> tuple[Any, int]:
        i = self.skip(i)
        c = self.s[i:i + 1]
        if c == "{":
            return self.obj(i)
        if c == "[":
            return self.arr(i)
        return _scalar(self.s, i)

    def obj(self, i: int) -> tuple[PosDict, int]:
        d = PosDict()
        d.line, d.key_lines = self.line(i), {}
        i = self.skip(i + 1)
        if self.s[i:i + 1] == "}":
            return d, i + 1
        while True:
            i = self.skip(i)
            if self.s[i:i + 1] != '"':
                raise self.error("expected a string key", i)
            key, j = _scalar(self.s, i)
            j = self.skip(j)
            if self.s[j:j + 1] != ":":
                raise self.error("expected ':'", j)
            d.key_lines[key] = self.line(i)
            d[key], i = self.value(j + 1)
            i = self.skip(i)
            c = self.s[i:i + 1]
            if c == "}":
                return d, i + 1
            if c != ",":
                raise self.error("expected ',' or '}'", i)
            i += 1

    def arr(self, i: int) -> tuple[PosList, int]:
        a = PosList()
        a.line = self.line(i)
        i = self.skip(i + 1)
        if self.s[i:i + 1] == "]":
            return a, i + 1
        while True:
            v, i = self.value(i)
            a.append(v)
            i = self.skip(i)
            c = self.s[i:i + 1]
            if c == "]":
                return a, i + 1
            if c != ",":
                raise self.error("expected ',' or ']'", i)
            i += 1


def loads(text: str) -> Any:
    """Parse JSON text; raises json.JSONDecodeError (with lineno) on bad input."""
    p = _Parser(text)
    try:
        v, i = p.value(0)
    except IndexError:
        raise p.error("unexpected end of data", len(text)) from None
    if p.skip(i) != len(text):
        raise p.error("extra data", p.skip(i))
    return v
