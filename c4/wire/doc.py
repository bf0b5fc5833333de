"""Render the field tables of docs/wire.md from the schemas (the schemas are the truth).

    python -m c4.wire.doc            # rewrite the generated part of docs/wire.md
    python -m c4.wire.doc --check    # exit 1 if docs/wire.md is stale (a test runs this)
"""
from __future__ import annotations

import sys
from pathlib import Path

from . import kinds
from .schema import Record, describe_record
from .sections import EVENTS, SECTIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "wire.md"
BEGIN = "<!-- BEGIN GENERATED: python -m c4.wire.doc -->"
END = "<!-- END GENERATED -->"


def _table(rec: Record, prefix: str = "") -> list[str]:
    lines = ["| field | type | required | meaning |", "|---|---|---|---|"]
    for path, typ, req, doc in describe_record(rec, prefix):
        typ = typ.replace("|", "\\|")
        lines.append(f"| `{path}` | {typ} | {'yes' if req else 'no'} | {doc} |")
    return lines


def render() -> str:
    out = ["### Envelope", "", *_table(kinds.ENVELOPE), ""]
    for kind, rec in kinds.BODIES.items():
        direction = "agent -> aggregator" if kind in kinds.FROM_AGENT else "aggregator -> agent"
        out += [f"### `{kind}` ({direction})", "", *_table(rec, "body"), ""]
    out += ["### Report sections", ""]
    for name, rec in SECTIONS.items():
        out += [f"#### `report.body.{name}`", "", *_table(rec, name), ""]
    out += ["### Event types", "", "`event.body.type` names one of these; `event.body.attrs` "
            "follows its table.", ""]
    for name in sorted(EVENTS):
        out += [f"#### `{name}`", "", *_table(EVENTS[name], "attrs"), ""]
    return "\n".join(out)


def splice(text: str, generated: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    if not sep:
        raise SystemExit(f"{DOC}: marker {BEGIN!r} not found")
    _, sep, tail = rest.partition(END)
    if not sep:
        raise SystemExit(f"{DOC}: marker {END!r} not found")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: list[str]) -> int:
    text = DOC.read_text()
    new = splice(text, render())
    if "--check" in argv:
        if new != text:
            print(f"{DOC} is stale: run `python -m c4.wire.doc`", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
