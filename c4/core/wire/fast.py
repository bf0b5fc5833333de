"""Body validation in C: msgspec types generated from the schema DSL (schema.py).

The DSL stays the one source and the reference: the types here are derived from the same spec
objects at import (ranges, lengths, enums, required/optional/unknown fields), so a change to a
section's schema changes them too, and docs/wire.md is still rendered from the DSL.

`decode` unpacks a frame once, in C: the envelope's fields as they come, its body by the
kind's generated type (everything but the string patterns), then turned into the maps and lists
the DSL returns (`msgspec.to_builtins`; a number field keeps an int an int). The reference's
own envelope, version and kind checks run on that (`wire.from_obj`), with a body check that
only matches the patterns (against a cache of names already matched: counter and device names
repeat in every frame; msgspec would call Python's `re` once per string, which cost more than
all the rest). When anything is refused or uncertain, the reference decodes the bytes again and
validates the body in full, so the reject and its reason are exactly its own: rejects are rare
and cost what they always did. Correctness rests on one
property, "the fast path accepts => the DSL accepts", which tests/unit/test_wire_fast.py checks
(hypothesis over every kind, the golden recording, the hostile frames). Each generated type is
at least as strict as its spec; a spec msgspec cannot express exactly raises `Unsupported`, and
its kind keeps the reference path (`FAST_KINDS` lists those that have a fast one).
"""
from __future__ import annotations

import math
import sys
from operator import methodcaller
from typing import Annotated, Any, Callable, Literal, Optional, Union

import msgspec

from . import DEFAULT_MAX_FRAME, Frame, Rejected, from_obj, kinds
from . import decode as reference_decode
from .schema import Bool, Enum, Float, Int, List, Map, Nullable, Record, Spec, Str
from .sections import EVENTS

__all__ = ["decode", "FAST_KINDS", "FAST_EVENTS", "Unsupported", "spec_type"]

_I64_MIN, _I64_MAX, _U64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_FLOAT_MAX = sys.float_info.max  # bounds on every float: msgspec accepts nan/inf otherwise
_EXACT_FLOAT = 2.0**53  # msgspec compares an int against float bounds as a float: exact below
NAMES_CACHED = 65536  # matched strings remembered per pattern (cleared when full)


class Unsupported(TypeError):
    """A spec msgspec cannot express exactly (its kind then keeps the reference path)."""


def _meta(**kw: Any) -> msgspec.Meta:
    return msgspec.Meta(**{k: v for k, v in kw.items() if v is not None})


def _int(spec: Int) -> Any:
    # msgpack carries ints in [-2^63, 2^64-1]; msgspec bounds must fit an int64.
    lo = spec.min if spec.min is not None and spec.min > _I64_MIN else None
    hi = spec.max if spec.max is not None and spec.max < _U64_MAX else None
    for b in (lo, hi):
        if b is not None and not _I64_MIN <= b <= _I64_MAX:
            raise Unsupported(f"integer bound {b} outside int64")
    return Annotated[int, _meta(ge=lo, le=hi)] if lo is not None or hi is not None else int


def _float(spec: Float) -> Any:
    """int or float, each kept as it came (the DSL accepts an int where a number is asked for,
    and the decoded body keeps it an int)."""
    for b in (spec.min, spec.max):
        if b is not None and abs(b) >= _EXACT_FLOAT:
            raise Unsupported(f"float bound {b} not exact for integer values")
    lo = -_FLOAT_MAX if spec.min is None else spec.min
    hi = _FLOAT_MAX if spec.max is None else spec.max
    ilo = None if spec.min is None else math.ceil(spec.min)
    ihi = None if spec.max is None else math.floor(spec.max)
    as_int = Annotated[int, _meta(ge=ilo, le=ihi)] if spec.min is not None or \
        spec.max is not None else int
    return Union[as_int, Annotated[float, _meta(ge=lo, le=hi)]]


class _Generator:
    """Spec -> msgspec type. Patterns are left out (see `_patterns`); `raw`: ids of specs kept
    as undecoded bytes (event attrs, validated by their type's own decoder)."""

    def __init__(self, raw: frozenset[int] = frozenset()) -> None:
        self.raw = raw
        self.records: dict[int, Any] = {}  # one Struct per Record object (shared specs)

    def type(self, spec: Spec) -> Any:
        if id(spec) in self.raw:
            return msgspec.Raw
        if isinstance(spec, Int):
            return _int(spec)
        if isinstance(spec, Float):
            return _float(spec)
        if isinstance(spec, Str):
            return Annotated[str, _meta(max_length=spec.max_len, min_length=spec.min_len or None)]
        if isinstance(spec, Bool):
            return bool
        if isinstance(spec, Enum):
            return Literal[spec.values]
        if isinstance(spec, Nullable):
            return Optional[self.type(spec.inner)]
        if isinstance(spec, List):
            return Annotated[list[self.type(spec.item)],  # type: ignore[misc]
                             _meta(max_length=spec.max_len, min_length=spec.min_len or None)]
        if isinstance(spec, Map):
            return Annotated[dict[self.type(spec.key), self.type(spec.value)],  # type: ignore[misc]
                             _meta(max_length=spec.max_len)]
        if isinstance(spec, Record):
            return self.record(spec)
        raise Unsupported(f"no msgspec type for {type(spec).__name__}")

    def record(self, spec: Record) -> Any:
        t = self.records.get(id(spec))
        if t is None:
            fields: list[tuple[str, Any] | tuple[str, Any, Any]] = []
            rename: dict[str, str] = {}
            for i, (name, sub, required) in enumerate(spec.fields()):
                attr = f"f{i}"  # wire names may be Python keywords (`from`)
                rename[attr] = name
                fields.append((attr, self.type(sub)) if required
                              else (attr, self.type(sub), msgspec.UNSET))
            t = msgspec.defstruct(f"R{len(self.records)}", fields, kw_only=True, rename=rename,
                                  forbid_unknown_fields=not spec.open, gc=False)
            self.records[id(spec)] = t
        return t


def spec_type(spec: Spec) -> Any:
    """The msgspec type of one spec, patterns left out (for tests)."""
    return _Generator().type(spec)


# ------------------------------------------------------------------------------ patterns
class _Miss(Exception):
    """A string that does not match its pattern (the reference then names it)."""


Check = Callable[[Any], None]
# Per pattern (Str spec): the strings known to match it, and a check that learns new ones.
# None is in every set: msgspec has checked the types, so a None is an absent optional field
# (dict.get) or a nil where the spec allows one, never a string.
_NAMES: dict[int, tuple[set[str | None], Check]] = {}


def _names(spec: Str) -> tuple[set[str | None], Check]:
    if id(spec) not in _NAMES:
        ok: set[str | None] = {None}
        match = spec._match

        def check(v: Any) -> None:
            if v not in ok:
                if not match(v):
                    raise _Miss
                if len(ok) >= NAMES_CACHED:  # a peer inventing names costs matches, not memory
                    ok.clear()
                    ok.add(None)
                ok.add(v)
        _NAMES[id(spec)] = (ok, check)
    return _NAMES[id(spec)]


def _direct(spec: Spec) -> Str | None:
    """The pattern-checked string a field is, nil allowed or not; None if it is not one."""
    inner = spec.inner if isinstance(spec, Nullable) else spec
    return inner if isinstance(inner, Str) and inner._match is not None else None


def _patterns(spec: Spec, memo: dict[int, Check | None]) -> Check | None:
    """A function that matches every pattern-constrained string of a value msgspec has already
    validated against `spec`, or None when no pattern is below it. Walks only those paths, and
    where it can, checks a whole map's keys or a whole array of records' field at C speed
    against the strings already known to match (counter, device, address names repeat)."""
    if id(spec) in memo:
        return memo[id(spec)]
    out: Check | None = None
    if (direct := _direct(spec)) is not None:
        out = _names(direct)[1]
    elif isinstance(spec, Nullable):
        inner = _patterns(spec.inner, memo)
        if inner is not None:
            def out(v: Any, inner: Check = inner) -> None:
                if v is not None:
                    inner(v)
    elif isinstance(spec, List) and isinstance(spec.item, Record):
        fields, deeper = _record_fields(spec.item, memo)
        if fields or deeper:
            def out(v: Any, fields: list[tuple[Any, set[str | None], Check]] = fields,
                    deeper: list[tuple[str, Check]] = deeper) -> None:
                for get, known, check in fields:
                    if not known.issuperset(map(get, v)):
                        for x in map(get, v):
                            check(x)
                for name, c in deeper:
                    for rec in v:
                        x = rec.get(name, _ABSENT)
                        if x is not _ABSENT:
                            c(x)
    elif isinstance(spec, List):
        item = _patterns(spec.item, memo)
        if item is not None:
            def out(v: Any, item: Check = item) -> None:
                for x in v:
                    item(x)
    elif isinstance(spec, Map):
        val = _patterns(spec.value, memo)
        key = _direct(spec.key)
        known, kcheck = _names(key) if key is not None else (set(), None)
        if kcheck is not None or val is not None:
            def out(v: Any, known: set[str | None] = known, kcheck: Check | None = kcheck,
                    val: Check | None = val) -> None:
                if kcheck is not None and not known.issuperset(v):
                    for k in v:
                        kcheck(k)
                if val is not None:
                    for x in v.values():
                        val(x)
    elif isinstance(spec, Record):
        fields, deeper = _record_fields(spec, memo)
        if fields or deeper:
            def out(v: Any, fields: list[tuple[Any, set[str | None], Check]] = fields,
                    deeper: list[tuple[str, Check]] = deeper) -> None:
                for get, known, check in fields:
                    x = get(v)
                    if x not in known:
                        check(x)
                for name, c in deeper:
                    x = v.get(name, _ABSENT)
                    if x is not _ABSENT:
                        c(x)
    memo[id(spec)] = out
    return out


def _record_fields(rec: Record, memo: dict[int, Check | None]
                   ) -> tuple[list[tuple[Any, set[str | None], Check]], list[tuple[str, Check]]]:
    """A record's pattern-checked string fields as (getter, known, check), and checks of its
    fields that hold patterns deeper down."""
    fields, deeper = [], []
    for name, sub, _ in rec.fields():
        if (direct := _direct(sub)) is not None:
            fields.append((methodcaller("get", name), *_names(direct)))
        elif (c := _patterns(sub, memo)) is not None:
            deeper.append((name, c))
    return fields, deeper


_ABSENT = object()


# ------------------------------------------------------------------------------ per kind
def _build(specs: dict[str, Record], raw: frozenset[int] = frozenset()
           ) -> tuple[dict[str, msgspec.msgpack.Decoder[Any]], dict[str, Check | None]]:
    decoders: dict[str, msgspec.msgpack.Decoder[Any]] = {}
    patterns: dict[str, Check | None] = {}
    memo: dict[int, Check | None] = {}
    for name, spec in specs.items():
        try:
            decoders[name] = msgspec.msgpack.Decoder(_Generator(raw).type(spec))
        except (Unsupported, TypeError):  # TypeError: msgspec refused the type
            continue
        patterns[name] = _patterns(spec, memo)
    return decoders, patterns


# Event attrs are validated by type (kinds.validate_body): kept as raw bytes, decoded after.
_ATTRS_SPEC = kinds.EVENT_HEAD.required["attrs"]
_BODY, _BODY_PATTERNS = _build(kinds.BODIES, frozenset({id(_ATTRS_SPEC)}))
_EVENT, _EVENT_PATTERNS = _build(EVENTS)
FAST_KINDS = frozenset(_BODY)
FAST_EVENTS = frozenset(_EVENT)
_FIELDS = [n for n, _, _ in kinds.EVENT_HEAD.fields()]
_TYPE_ATTR, _ATTRS_ATTR = f"f{_FIELDS.index('type')}", f"f{_FIELDS.index('attrs')}"


# The envelope as a struct whose body stays undecoded until its kind's type decodes it; its
# other fields are taken as they come and checked by the reference (wire.from_obj). Unknown
# envelope fields are refused, as ENVELOPE does.
_ENV_BODY = kinds.ENVELOPE.required["body"]
_ENVELOPE: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(msgspec.defstruct(
    "Envelope", [(n, msgspec.Raw) if s is _ENV_BODY else (n, Any, msgspec.UNSET)
                 for n, s, _ in kinds.ENVELOPE.fields()],
    kw_only=True, forbid_unknown_fields=True, gc=False))
_ENV_FIELDS = [n for n, _, _ in kinds.ENVELOPE.fields() if n != "body"]
_UNTYPED = msgspec.msgpack.Decoder()


def _unpack(data: bytes) -> dict[str, Any] | None:
    """The frame as wire.decode's unpacking makes it, unpacked once and its body validated by
    type (everything but patterns) on the way; None means "not known", never "invalid": the
    reference then decides."""
    try:
        env = _ENVELOPE.decode(data)
        kind = env.kind
        dec = _BODY.get(kind) if type(kind) is str else None
        if dec is None:
            return None
        body = dec.decode(env.body)
        if kind == "event":
            attrs = _EVENT.get(getattr(body, _TYPE_ATTR))
            if attrs is None:
                return None
            attrs.decode(getattr(body, _ATTRS_ATTR))
            body = _UNTYPED.decode(env.body)  # attrs as a map, as the DSL keeps them
        else:
            # Structs -> the maps the DSL returns; absent optional fields stay absent
            body = msgspec.to_builtins(body)
        obj = {n: v for n in _ENV_FIELDS if (v := getattr(env, n)) is not msgspec.UNSET}
        obj["body"] = body
        return obj
    except Exception:  # noqa: BLE001 - any failure (validation, decoding, depth): ask the reference
        return None


def _check_patterns(kind: str, body: Any) -> dict[str, Any]:
    """check_body for wire.from_obj after _unpack: only the patterns are left to match."""
    try:
        check = _BODY_PATTERNS[kind]
        if check is not None:
            check(body)
        if kind == "event":
            attrs = _EVENT_PATTERNS[body["type"]]
            if attrs is not None:
                attrs(body["attrs"])
        return body  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - _Miss or anything unforeseen: the reference names it
        return kinds.validate_body(kind, body)


def decode(data: bytes, max_frame: int = DEFAULT_MAX_FRAME) -> Frame:
    """`wire.decode` with the frame unpacked once and its body validated in C: the same Frames,
    the same Rejected (any refusal on the fast path is decided again by the reference, from the
    bytes, so its reason is the reference's)."""
    if len(data) <= max_frame and (obj := _unpack(data)) is not None:
        try:
            return from_obj(obj, check_body=_check_patterns)
        except Rejected:
            pass
    return reference_decode(data, max_frame)
