"""Wire protocol v1: one msgpack map per ZeroMQ frame, validated on decode.

The envelope and every kind are specified in docs/wire.md; the schemas below are the source
of truth and the doc's field tables are generated from them (`python -m c4.core.wire.doc`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import msgpack

from . import kinds
from .schema import Invalid

MAJOR = 1
MINOR = 0
SUPPORTED_MAJORS = (1,)
DEFAULT_MAX_FRAME = 1 << 20  # 1 MiB: a report of 1,000 flows and 64 ports fits in ~200 KiB

# Why a frame was rejected; each has a counter in the aggregator.
REJECT_REASONS = (
    "internal",  # a bug on the aggregator's side: the frame is refused, the process goes on
    "host_limit",  # a new host while `max_hosts` are known and none of them is silent
    "too_large", "malformed", "bad_envelope", "unsupported_version", "unknown_kind", "bad_body",
    "unexpected_kind", "identity",
)


class Rejected(ValueError):
    """A frame that cannot be accepted. `code` is one of REJECT_REASONS."""

    def __init__(self, code: str, detail: str, frame: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
        self.frame = frame  # the decoded envelope when it got that far (to address a reply)


@dataclass(frozen=True, slots=True)
class Frame:
    kind: str
    host: str
    boot: str
    seq: int
    ts: float
    body: dict[str, Any]
    version: tuple[int, int] = (MAJOR, MINOR)
    floor: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"v": list(self.version), "kind": self.kind, "host": self.host, "boot": self.boot,
             "seq": self.seq, "ts": self.ts, "body": self.body}
        if self.floor is not None:
            d["floor"] = self.floor
        return d


def encode(frame: Frame, validate: bool = True, raw: Mapping[str, bytes] | None = None) -> bytes:
    """Encode a frame. Validation on the sending side catches our own bugs before a peer does.
    `raw`: body sections already encoded (msgpack of `frame.body[key]`, which is still what
    is validated), spliced in as they are: the bytes are those of encoding the whole frame."""
    if validate:
        kinds.validate_body(frame.kind, frame.body)
    d = frame.to_dict()
    if not raw:
        data: bytes = msgpack.packb(d, use_bin_type=True)
        return data
    pack = msgpack.Packer(use_bin_type=True)
    out = [pack.pack_map_header(len(d))]
    for k, v in d.items():
        out.append(pack.pack(k))
        if k != "body":
            out.append(pack.pack(v))
            continue
        out.append(pack.pack_map_header(len(v)))
        for section, value in v.items():
            out += (pack.pack(section), raw[section] if section in raw else pack.pack(value))
    return b"".join(out)


def decode(data: bytes, max_frame: int = DEFAULT_MAX_FRAME,
           check_body: Callable[[str, Any], dict[str, Any]] = kinds.validate_body) -> Frame:
    """Decode and validate one frame, or raise Rejected with the reason. This is the reference;
    `wire.fast.decode` passes a `check_body` that trusts a body it validated in C."""
    if len(data) > max_frame:
        raise Rejected("too_large", f"{len(data)} bytes > limit {max_frame}")
    try:
        obj = msgpack.unpackb(
            data, raw=False, use_list=True, strict_map_key=True,
            max_str_len=max_frame, max_bin_len=max_frame,
            max_array_len=max_frame, max_map_len=max_frame, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise Rejected("malformed", f"not a msgpack value: {type(exc).__name__}: {exc}") from None
    return from_obj(obj, check_body)


def from_obj(obj: Any, check_body: Callable[[str, Any], dict[str, Any]] = kinds.validate_body
             ) -> Frame:
    """The checks of `decode` after unpacking (`wire.fast` unpacks in C)."""
    if not isinstance(obj, dict):
        raise Rejected("malformed", f"frame is a {type(obj).__name__}, expected a map")
    try:
        env = kinds.ENVELOPE.check(obj)
    except Invalid as exc:
        raise Rejected("bad_envelope", str(exc),
                       obj if isinstance(obj.get("host"), str) else None) from None
    floor = env.get("floor")
    if floor is not None and floor > env["seq"]:
        raise Rejected("bad_envelope", f"floor {floor} is above seq {env['seq']}", env)
    major, minor = env["v"]
    if major not in SUPPORTED_MAJORS:
        raise Rejected("unsupported_version",
                       f"protocol {major}.{minor} is not supported; this end speaks "
                       f"{', '.join(f'{m}.x' for m in SUPPORTED_MAJORS)}", env)
    if env["kind"] not in kinds.BODIES:
        raise Rejected("unknown_kind", f"unknown kind {env['kind']!r}", env)
    try:
        body = check_body(env["kind"], env["body"])
    except Invalid as exc:
        raise Rejected("bad_body", f"{env['kind']}: {exc}", env) from None
    return Frame(env["kind"], env["host"], env["boot"], env["seq"], env["ts"], body,
                 (major, minor), env.get("floor"))


__all__ = ["Frame", "Rejected", "encode", "decode", "from_obj", "MAJOR", "MINOR", "DEFAULT_MAX_FRAME",
           "REJECT_REASONS", "Invalid"]
