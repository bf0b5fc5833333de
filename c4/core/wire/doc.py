"""Render the field tables of docs/wire.md from the schemas (the schemas are the truth).
`python -m c4.cli.docs` splices them into the doc."""
from __future__ import annotations

from . import kinds
from .schema import Record, describe_record
from .sections import EVENTS, SECTIONS

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
