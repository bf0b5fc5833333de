"""Rendering of golden incidents (tests/fixtures/incidents) for people: tables, detail, heatmap."""
from __future__ import annotations

import copy
import io
import json
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console, RenderableType

from c4.cli.render import flatten, fmt_duration, heatmap, incident_view, incidents_table, window

NOW = 1718002000.0  # 2024-06-10 06:46:40Z
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def load(fixtures: Path, name: str) -> dict[str, Any]:
    return json.loads((fixtures / "incidents" / f"{name}.json").read_text())


def text(r: RenderableType, width: int = 160, **console: Any) -> str:
    c = Console(file=io.StringIO(), width=width, color_system=None, **console)
    c.print(r)
    return c.file.getvalue()


@pytest.fixture
def incidents(fixtures: Path) -> list[dict[str, Any]]:
    return [load(fixtures, n) for n in ("noncomm_hang_42", "comm_slow_7", "minimal_3")]


def test_incident_list_shows_one_row_per_incident_newest_first(incidents: list[dict[str, Any]]) -> None:
    out = text(incidents_table(incidents, NOW))
    assert "3 incident(s)" in out
    rows = {int(line.split()[0]): line for line in out.splitlines() if re.match(r"\s*\d+\s+[a-z]+\s+[a-z_]+\s", line)}
    assert list(rows) == [7, 3, 42]  # by detection time, newest first
    for cell in ("open", "noncomm_hang", "llm-train-7b", "rank 17 @gpu-07 (95%)", "32m49s ago"):
        assert cell in rows[42]
    assert "link leaf-3:eth12<->spine-1:eth3 (71%)" in rows[7] and "mitigated" in rows[7]
    assert "host_silent" in rows[3] and "31m10s ago" in rows[3]


def test_incident_list_without_now_shows_times_not_ages(incidents: list[dict[str, Any]]) -> None:
    out = text(incidents_table(incidents))  # a replay: the wall clock means nothing
    assert "2024-06-10 06:13:50.500Z" in out and " ago" not in out


def test_hang_detail_has_times_suspects_evidence_actions(fixtures: Path) -> None:
    out = text(incident_view(load(fixtures, "noncomm_hang_42"), NOW))
    assert "Incident 42  noncomm_hang  [open]" in out
    assert "job llm-train-7b  comm 0x5f3a9c01" in out
    assert "rank 17 on gpu-07 never entered AllReduce seq 1843" in out
    detected = next(line for line in out.splitlines() if "│ detected" in line)
    assert "2024-06-10 06:13:50.500Z" in detected and "+30.5s" in detected
    resolved = next(line for line in out.splitlines() if "│ resolved" in line)
    assert "Z" not in resolved  # not resolved yet
    suspects = [line for line in out.splitlines() if re.match(r"│ [12] │", line)]
    assert "rank 17" in suspects[0] and "95%" in suspects[0]
    assert "gpu-03" in suspects[1] and "4%" in suspects[1]
    evidence = dict(re.findall(r"│ ([\w.]+)\s+│ (\S+)\s+│", out))
    assert evidence["seq.suspect"] == "1842" and evidence["seq.peers_min"] == "1843"
    assert evidence["peer_wait_states.SendPeerWait"] == "32" and evidence["stalled_s"] == "41.5"
    assert "dry-run" in out and "would run: scontrol update NodeName=gpu-07" in out
    assert "latency matrix" not in out  # a hang carries no matrix


def test_slow_detail_windows_the_heatmap_around_the_focus(fixtures: Path) -> None:
    out = text(incident_view(load(fixtures, "comm_slow_7"), NOW))
    assert "[gpu-37->gpu-05, gpu-36->gpu-05]" in out  # list evidence, not eaten as markup
    assert "counters.gpu-37/mlx5_3.np_cnp_sent" in out
    assert "rows 24-39 x columns 0-15 of 40" in out
    assert "focus gpu-37 -> gpu-05: 9.5 s/GB, 9.0x the baseline" in out
    grid = [line for line in out.splitlines() if re.match(r"\d+ gpu-\d\d ", line)]
    assert [int(line.split()[0]) for line in grid] == list(range(24, 40))
    assert out.count("[#]") == 1
    (focus_row,) = [line for line in grid if "[#]" in line]
    assert focus_row.startswith("37 gpu-37")
    header = next(line for line in out.splitlines() if line.strip().startswith("0  1  2 "))
    assert header.index("5") == focus_row.index("[#]") + 1  # the glyph sits under column 5
    # The diagonal has no data and every other cell is within 1.25x of the baseline.
    assert set("".join(grid).replace("[#]", "")) <= set(" .0123456789gpu-")


def test_ring_heatmap_grades_against_the_healthy_quarter(fixtures: Path) -> None:
    # A real incident: `c4 sim --fault slow-node:node002` diagnosed by a live aggregator. In a
    # ring half the connections touch the slow node; against the median they would look mild.
    inc = load(fixtures, "comm_slow_sim_1")
    out = text(heatmap(inc["matrix"]))
    grid = {line.split()[1]: line for line in out.splitlines() if re.match(r"\d \d@node", line)}
    glyphs = {label: re.sub(r"^\d \S+\s", "", line).replace("[", " ").replace("]", " ").split()
              for label, line in grid.items()}
    slow = {label for label, g in glyphs.items() if g == ["o"]}
    assert slow == {"2@node001", "3@node001", "4@node002", "5@node002"}  # to or from node002
    assert all(g == ["."] for label, g in glyphs.items() if label not in slow)
    assert "focus 2@node001 -> 5@node002: 0.0651 s/GB, 3.5x the baseline" in out
    assert "[o]" in grid["2@node001"]


def test_minimal_incident_renders_without_optional_fields(fixtures: Path) -> None:
    out = text(incident_view(load(fixtures, "minimal_3"), NOW))
    assert "Incident 3  host_silent  [resolved]" in out
    assert "suspects: none localised yet" in out and "actions: none" in out
    assert "evidence" not in out and "latency matrix" not in out
    localised = next(line for line in out.splitlines() if "│ localised" in line)
    assert re.search(r"│ localised\s+│ -\s+│ -\s+│ -\s+│", localised)


@pytest.mark.parametrize("n, center, size, expected", [
    (40, 37, 16, range(24, 40)),  # clamped at the far edge
    (40, 2, 16, range(0, 16)),    # clamped at the near edge
    (40, 20, 16, range(12, 28)),  # centred
    (10, 9, 16, range(0, 10)),    # small matrix: all of it
    (16, 15, 16, range(0, 16)),
])
def test_window(n: int, center: int, size: int, expected: range) -> None:
    assert window(n, center, size) == expected


def test_heatmap_without_focus_centres_on_the_slowest_cell(fixtures: Path) -> None:
    m = copy.deepcopy(load(fixtures, "comm_slow_7")["matrix"])
    m["focus"] = None
    m["cells"][37][5] = 1.0
    m["cells"][3][30] = 3.0  # 2-4x the baseline (1.05)
    m["cells"][3][31] = 1.8  # 1.25-2x
    out = text(heatmap(m, size=8))
    assert "rows 0-7 x columns 26-33 of 40" in out
    row3 = next(line for line in out.splitlines() if line.startswith("3 gpu-03"))
    assert "[o]" in row3 and " : " in row3


def test_heatmap_degrades_on_bad_or_empty_matrices(fixtures: Path) -> None:
    m = load(fixtures, "comm_slow_7")["matrix"]
    assert "malformed" in text(heatmap({"labels": m["labels"], "cells": m["cells"][:3]}))
    bad = copy.deepcopy(m)
    bad["cells"][2][3] = "slow"
    assert "malformed" in text(heatmap(bad))
    empty = {"labels": ["a", "b"], "cells": [[None, None], [None, None]], "focus": None}
    assert "no data" in text(heatmap(empty))


def test_heatmap_colour_only_on_a_colour_terminal(fixtures: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = load(fixtures, "comm_slow_7")["matrix"]
    c = Console(file=io.StringIO(), width=160, force_terminal=True, color_system="standard")
    c.print(heatmap(m))
    coloured = c.file.getvalue()
    assert "\x1b[31m" in coloured or "\x1b[1;7;31m" in coloured  # red: the focus cell
    assert ANSI.sub("", coloured) == text(heatmap(m))  # same glyphs with or without colour
    monkeypatch.setenv("NO_COLOR", "1")
    c = Console(file=io.StringIO(), width=160, force_terminal=True)
    c.print(heatmap(m))
    assert not re.search(r"\x1b\[[0-9;]*3[0-7]m", c.file.getvalue())  # no foreground colours


def test_flatten_and_durations() -> None:
    rows = flatten({"b": {"y": 2, "x": [1, 2]}, "a": [{"k": 1}, {"k": 2}]})
    assert rows == [("a[0].k", 1), ("a[1].k", 2), ("b.x", [1, 2]), ("b.y", 2)]
    assert [fmt_duration(s) for s in (0.75, 41.5, 185, 8040, 273600, -12)] == \
        ["0.75s", "41.5s", "3m05s", "2h14m", "3d04h", "-12s"]
