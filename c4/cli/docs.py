"""Keep the generated parts of docs/ true to the code.

    python -m c4.cli.docs            # rewrite the generated tables in docs/wire.md, docs/config.md
    python -m c4.cli.docs --check    # exit 1 if any is stale (a unit test runs this)
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

DOCS = Path(__file__).resolve().parents[2] / "docs"
BEGIN = "<!-- BEGIN GENERATED: python -m c4.cli.docs -->"
END = "<!-- END GENERATED -->"


def _config_tables() -> str:
    from c4.agent.config import AgentConfig
    from c4.aggregator.actions import ActionsConfig
    from c4.aggregator.alerts import AlertsConfig, Receiver
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.diagnosis.config import DiagnosisConfig
    from c4.aggregator.federation import FederationConfig, Peer
    from c4.aggregator.planner.config import PlanningConfig

    from c4.core.config import describe

    out = []
    for title, cls in (("agent.toml", AgentConfig), ("aggregator.toml", AggregatorConfig),
                       ("aggregator.toml `[diagnosis]`", DiagnosisConfig),
                       ("aggregator.toml `[actions]`", ActionsConfig),
                       ("aggregator.toml `[planning]`", PlanningConfig),
                       ("aggregator.toml `[alerts]`", AlertsConfig),
                       ("aggregator.toml `[[alerts.receivers]]`", Receiver),
                       ("aggregator.toml `[federation]`", FederationConfig),
                       ("aggregator.toml `[[federation.peers]]`", Peer)):
        out += [f"### {title}", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for key, typ, default, doc in describe(cls):
            out.append(f"| `{key}` | {typ} | `{default}` | {doc} |".replace("\n", " "))
        out.append("")
    return "\n".join(out)


def _wire_tables() -> str:
    from c4.core.wire.doc import render

    return render()


GENERATED: dict[str, Callable[[], str]] = {"wire.md": _wire_tables, "config.md": _config_tables}


def splice(text: str, generated: str, name: str) -> str:
    head, sep, rest = text.partition(BEGIN)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"docs/{name}: generated-region markers not found")
    return f"{head}{BEGIN}\n{generated}\n{END}{tail}"


def main(argv: list[str]) -> int:
    stale = []
    for name, render in GENERATED.items():
        path = DOCS / name
        text = path.read_text()
        new = splice(text, render(), name)
        if new != text:
            stale.append(name)
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print(f"stale: {', '.join('docs/' + n for n in stale)}: run `python -m c4.cli.docs`",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
