"""Rendering for people: incident tables, incident detail and the latency-matrix heatmap.

Everything returns rich renderables; the caller's Console decides colour. Without a terminal
or with NO_COLOR, rich drops the styles and the heatmap still reads from its ASCII glyphs.
Times print in UTC: hosts and operators sit in different zones. Scripts use --json instead.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Iterable

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

HEATMAP_WINDOW = 16
# (upper bound of value / baseline, glyph, colour): a cell's slowness against the baseline.
SCALE = ((1.25, ".", "green"), (2.0, ":", "yellow"), (4.0, "o", "dark_orange"), (float("inf"), "#", "red"))
STATE_STYLE = {"open": "bold red", "mitigated": "yellow", "resolved": "green"}
_MAX_LIST = 8  # evidence lists longer than this are elided


def fmt_ts(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def fmt_duration(s: float) -> str:
    """Compact and sign-aware: 0.75s, 41.5s, 3m05s, 2h14m, 3d04h."""
    sign, s = ("-" if s < 0 else ""), abs(s)
    if s < 60:
        return f"{sign}{s:.3g}s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{sign}{m}m{sec:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{sign}{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{sign}{d}d{h:02d}h"


def fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        shown = ", ".join(fmt_value(x) for x in v[:_MAX_LIST])
        return f"[{shown}{f', ... ({len(v) - _MAX_LIST} more)' if len(v) > _MAX_LIST else ''}]"
    if v is None:
        return "-"
    return str(v)


def flatten(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested evidence as (dotted key, leaf) rows; lists of objects get [i] keys."""
    if isinstance(obj, dict):
        rows: list[tuple[str, Any]] = []
        for k in sorted(obj, key=str):
            rows.extend(flatten(obj[k], f"{prefix}.{k}" if prefix else str(k)))
        return rows
    if isinstance(obj, list) and any(isinstance(x, (dict, list)) for x in obj):
        return [row for i, x in enumerate(obj) for row in flatten(x, f"{prefix}[{i}]")]
    return [(prefix, obj)]


def window(n: int, center: int, size: int = HEATMAP_WINDOW) -> range:
    """`size` consecutive indices of 0..n-1 around `center`, shifted inwards at the edges."""
    if n <= size:
        return range(n)
    start = min(max(0, center - size // 2), n - size)
    return range(start, start + size)


def top_suspect(inc: dict[str, Any]) -> dict[str, Any] | None:
    suspects = inc.get("suspects") or []
    return max(suspects, key=lambda s: s.get("confidence", 0.0)) if suspects else None


def _suspect_text(s: dict[str, Any] | None) -> str:
    if s is None:
        return "-"
    kind, sid = str(s.get("kind", "?")), str(s.get("id", "?"))
    name = sid if sid.startswith(kind) else f"{kind} {sid}"
    where = f" @{s['host']}" if s.get("host") and s["host"] != sid else ""
    return f"{name}{where} ({s.get('confidence', 0.0):.0%})"


def _row(t: Table, *cells: Any) -> None:
    # Plain strings would be parsed as rich markup: "[gpu-3]" in a summary must print as is.
    t.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))


def incidents_table(incidents: list[dict[str, Any]], now: float | None = None) -> Table:
    """One row per incident, newest first. Without `now` (a replay: ages against the wall clock
    mean nothing) the detected column holds the time itself."""
    t = Table(title=f"{len(incidents)} incident(s)", title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, collapse_padding=True)
    # A narrow terminal squeezes the long columns; the short ones stay on one line.
    for col in ("id", "state", "class"):
        t.add_column(col, justify="right" if col == "id" else "left", no_wrap=True)
    t.add_column("job", max_width=20, overflow="fold")
    t.add_column("top suspect", max_width=48, overflow="fold")
    t.add_column("detected", no_wrap=True)
    t.add_column("summary", overflow="fold")
    for inc in sorted(incidents, key=lambda i: -(i.get("detected") or 0.0)):
        state = inc.get("state", "?")
        detected = inc.get("detected")
        when = fmt_ts(detected) if now is None or detected is None else f"{fmt_duration(now - detected)} ago"
        _row(t, str(inc.get("id", "?")), Text(state, STATE_STYLE.get(state, "")), inc.get("class", "?"),
             inc.get("job") or "-", _suspect_text(top_suspect(inc)), when, inc.get("summary", ""))
    return t


def incident_view(inc: dict[str, Any], now: float) -> Group:
    """Everything about one incident, top to bottom: what, when, who, why, what was done, where."""
    state = inc.get("state", "?")
    head = Text.assemble((f"Incident {inc.get('id', '?')}", "bold"), "  ", (str(inc.get("class", "?")), "bold cyan"),
                         "  ", (f"[{state}]", STATE_STYLE.get(state, "")))
    ctx = "  ".join(f"{k} {inc[k]}" for k in ("job", "comm") if inc.get(k))
    parts: list[RenderableType] = [head]
    if ctx:
        parts.append(Text(ctx))
    parts.append(Text(str(inc.get("summary", ""))))
    parts.append(_times_table(inc, now))
    parts.append(_suspects_table(inc.get("suspects") or []))
    evidence = flatten(inc.get("evidence") or {})
    if evidence:
        t = Table(title="evidence", title_justify="left")
        t.add_column("key")
        t.add_column("value", overflow="fold")
        for k, v in evidence:
            _row(t, k, fmt_value(v))
        parts.append(t)
    parts.append(_actions_table(inc.get("actions") or []))
    if inc.get("alerts"):
        parts.append(_alerts_table(inc["alerts"]))
    if inc.get("matrix"):
        parts.append(heatmap(inc["matrix"]))
    return Group(*parts)


def _alerts_table(alerts: dict[str, dict[str, Any]]) -> Table:
    """Notifications per alert receiver (aggregator/alerts.py): failures are retried."""
    t = Table(title="alert notifications", title_justify="left")
    for col in ("receiver", "sent", "failed", "last", "pending", "last error"):
        t.add_column(col, overflow="fold")
    for name, a in sorted(alerts.items()):
        _row(t, name, str(a.get("sent", 0)), str(a.get("failed", 0)), a.get("last") or "-",
             a.get("pending") or "-", a.get("last_error") or "")
    return t


def _times_table(inc: dict[str, Any], now: float) -> Table:
    t = Table(title="times (UTC)", title_justify="left")
    for col in ("", "time", "since first symptom", "age"):
        t.add_column(col)
    t0 = inc.get("first_symptom")
    for key, label in (("first_symptom", "first symptom"), ("detected", "detected"),
                       ("localised", "localised"), ("resolved", "resolved"), ("updated", "updated")):
        ts = inc.get(key)
        since = "-" if ts is None or t0 is None else f"+{fmt_duration(ts - t0)}"
        age = "-" if ts is None else f"{fmt_duration(now - ts)} ago"
        _row(t, label, fmt_ts(ts), since, age)
    return t


def _suspects_table(suspects: list[dict[str, Any]]) -> RenderableType:
    if not suspects:
        return Text("suspects: none localised yet")
    t = Table(title="suspects (most likely first)", title_justify="left")
    for col in ("#", "kind", "id", "host", "rank", "confidence"):
        t.add_column(col, justify="right" if col in ("#", "rank", "confidence") else "left")
    ranked = sorted(suspects, key=lambda s: -s.get("confidence", 0.0))
    for i, s in enumerate(ranked, 1):
        rank = s.get("rank")
        _row(t, str(i), s.get("kind", "?"), str(s.get("id", "?")), s.get("host") or "-",
             "-" if rank is None else str(rank), f"{s.get('confidence', 0.0):.0%}")
    return t


def _actions_table(actions: list[dict[str, Any]]) -> RenderableType:
    if not actions:
        return Text("actions: none")
    t = Table(title="actions", title_justify="left")
    for col in ("time", "action", "target", "backend", "outcome", "detail"):
        t.add_column(col, overflow="fold")
    for a in actions:
        outcome = a.get("outcome", "?")
        style = "green" if outcome in ("ok", "dry-run") else "yellow" if outcome.startswith("skipped") else "red"
        detail = a.get("detail") or ""
        if a.get("command") and a.get("outcome") != "dry-run":
            detail = f"{a['command']}: {detail}" if detail else a["command"]
        if a.get("stderr"):
            detail += f" | stderr: {a['stderr'].strip()[-200:]}"
        _row(t, fmt_ts(a.get("ts")), a.get("action", "?"), a.get("target") or "-", a.get("backend", "-"),
             Text(outcome, style), detail)
    return t


def _baseline(cells: Iterable[Iterable[float | None]]) -> float | None:
    """The lower quartile: in a ring, half the connections run through a slow node and would
    drag a median up; the faster quarter is still the healthy pace."""
    values = sorted(v for row in cells for v in row if v is not None)
    if len(values) > 1:
        return statistics.quantiles(values, n=4)[0]
    return values[0] if values else None


def _grade(ratio: float) -> tuple[str, str]:
    return next((glyph, colour) for bound, glyph, colour in SCALE if ratio <= bound)


def heatmap(matrix: dict[str, Any], size: int = HEATMAP_WINDOW) -> Text:
    """The latency matrix (row sends to column, seconds per GB) as glyphs graded against the
    baseline, windowed to size x size around the focus cell (or the slowest cell)."""
    labels, cells = matrix.get("labels") or [], matrix.get("cells") or []
    n = len(labels)
    if (n == 0 or len(cells) != n or any(not isinstance(r, list) or len(r) != n for r in cells)
            or not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0)
                       for r in cells for v in r)):
        return Text(f"latency matrix: malformed ({n} labels, {len(cells)} rows), see --json")
    base = _baseline(cells)
    if not base:
        return Text("latency matrix: no data yet")
    focus = matrix.get("focus")
    if not (isinstance(focus, list) and len(focus) == 2 and all(isinstance(x, int) and 0 <= x < n for x in focus)):
        focus = max(((i, j) for i in range(n) for j in range(n) if cells[i][j] is not None),
                    key=lambda ij: cells[ij[0]][ij[1]])
    fr, fc = focus
    rows, cols = window(n, fr, size), window(n, fc, size)
    fv = cells[fr][fc]
    out = Text()
    out.append("latency matrix", "bold")
    out.append(f" (s/GB, row sends to column; baseline {base:.3g}), rows {rows.start}-{rows.stop - 1} "
               f"x columns {cols.start}-{cols.stop - 1} of {n}\n")
    out.append(f"focus {labels[fr]} -> {labels[fc]}: "
               + ("no data" if fv is None else f"{fv:.3g} s/GB, {fv / base:.1f}x the baseline") + "\n")
    lw = min(24, max(len(str(labels[i])) for i in rows))
    iw = len(str(rows.stop - 1))
    out.append(" " * (iw + lw + 2) + "".join(f"{j:^3}"[-3:] for j in cols) + "\n", "dim")
    for i in rows:
        out.append(f"{i:>{iw}} {str(labels[i])[:lw]:<{lw}} ")
        for j in cols:
            v = cells[i][j]
            glyph, colour = (" ", "") if v is None else _grade(v / base)
            if (i, j) == (fr, fc):
                out.append(f"[{glyph}]", f"bold reverse {colour}")
            else:
                out.append(f" {glyph} ", colour)
        out.append("\n")
    out.append("legend: ", "dim")
    for bound, glyph, colour in SCALE[:-1]:
        out.append(glyph, colour)
        out.append(f" <={bound:g}x  ")
    out.append(SCALE[-1][1], SCALE[-1][2])
    out.append(f" >{SCALE[-2][0]:g}x the baseline (lower quartile)  ")
    out.append("[ ] focus  blank: no data", "dim")
    return out
