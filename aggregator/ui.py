"""/ui: one read-only page over the JSON API (no build step, no external assets).

Hosts and their state, open and recent incidents, and one incident at a time with its suspects,
its latency heatmap (seconds per GB, row sends to column, graded against the job's baseline)
and its alert deliveries; the C4P traffic plan: the busiest links' utilisation now and as the
proposal would place the flows, and the last plan applied. It refreshes every 5 s. Every value from agents and incidents is set
as text (textContent), never parsed as HTML: host and job names come from the agents.
"""
from __future__ import annotations

PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>c4</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:baseline}
header h1{font-size:18px;margin:0} header span{opacity:.75}
main{display:grid;grid-template-columns:minmax(300px,1fr) 2fr;gap:16px;padding:16px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:12px;overflow:auto}
h2{font-size:15px;margin:0 0 8px} table{border-collapse:collapse;width:100%}
td,th{padding:3px 6px;border-bottom:1px solid #eef0f3;text-align:left;white-space:nowrap}
th{font-weight:600;color:#555} tr.sel{background:#e8f0fe} tr.click{cursor:pointer}
.up{color:#137333}.silent,.open{color:#c5221f;font-weight:600}.mitigated{color:#b06000}
.resolved{color:#666} .muted{color:#777} pre{white-space:pre-wrap;font-size:12px;margin:0}
table.heat td{width:28px;height:22px;text-align:center;font-size:10px;border:1px solid #fff}
table.heat th{font-size:11px;font-weight:400} table.heat td.focus{outline:2px solid #1d2330}
#incident>div{margin-bottom:12px}
</style></head><body>
<header><h1>c4</h1><span id="summary">loading...</span></header>
<main>
<div><section><h2>Hosts</h2><table id="hosts"><thead><tr><th>host</th><th>state</th>
<th>last report</th><th>ports</th><th>collectors down</th></tr></thead><tbody></tbody></table>
</section>
<section id="plan" style="margin-top:16px" hidden><h2>Traffic plan (C4P)</h2>
<p id="plan-summary" class="muted"></p><table id="plan-links"><thead><tr><th>link</th>
<th>direction</th><th>now</th><th>planned</th><th>health</th></tr></thead><tbody></tbody></table>
<p id="plan-last" class="muted"></p></section></div>
<div><section><h2>Incidents</h2><table id="incidents"><thead><tr><th>#</th><th>class</th>
<th>state</th><th>job</th><th>top suspect</th><th>detected</th></tr></thead><tbody></tbody>
</table></section>
<section id="incident" style="margin-top:16px"><h2>Incident</h2>
<p class="muted">no incident selected</p></section></div>
</main>
<script>
"use strict";
const RECENT = 20;
let selected = null;
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}
async function get(path) {
  const r = await fetch(path, {cache: "no-store"});
  if (!r.ok) throw new Error(path + ": HTTP " + r.status);
  return r.json();
}
function when(ts) { return ts ? new Date(ts * 1000).toLocaleString() : "-"; }
function age(s) { return s < 90 ? s.toFixed(1) + " s ago" : Math.round(s / 60) + " min ago"; }
function suspect(s) { return s ? s.kind + " " + s.id + " (" + Math.round(s.confidence * 100) + "%)" : "-"; }
function fill(tbody, rows) { tbody.replaceChildren(...rows); }
function renderHosts(hosts) {
  fill(document.querySelector("#hosts tbody"), hosts.map(h => el("tr", {},
    el("td", {}, h.name), el("td", {class: h.status}, h.status),
    el("td", {}, age(h.last_seen_age_s)), el("td", {}, h.ports_active + "/" + h.ports),
    el("td", {}, (h.collectors_down || []).join(", ") || "-"))));
}
function renderIncidents(list) {
  const open = list.filter(i => i.state !== "resolved");
  const recent = list.filter(i => i.state === "resolved").slice(0, RECENT);
  fill(document.querySelector("#incidents tbody"), open.concat(recent).map(i => {
    const tr = el("tr", {class: "click" + (i.id === selected ? " sel" : ""), id: "row-" + i.id},
      el("td", {}, i.id), el("td", {}, i.class), el("td", {class: i.state}, i.state),
      el("td", {}, i.job || "-"), el("td", {}, suspect((i.suspects || [])[0])),
      el("td", {}, when(i.detected)));
    tr.addEventListener("click", () => { location.hash = "incident-" + i.id; });
    return tr;
  }));
  return open.length;
}
function heatmap(m, baseline) {
  const labels = m.labels || [], cells = m.cells || [], focus = m.focus || [];
  const vals = cells.flat().filter(v => v !== null).sort((a, b) => a - b);
  if (!vals.length) return el("p", {class: "muted"}, "latency matrix: no data yet");
  // the job's baseline from the evidence; else the lower quartile (slow cells may be many)
  const base = baseline || vals[Math.floor(vals.length / 4)] || 1e-9;
  const head = el("tr", {}, el("th", {}, "from \\\\ to"), ...labels.map(l => el("th", {}, l)));
  const rows = cells.map((row, r) => el("tr", {}, el("th", {}, labels[r]), ...row.map((v, c) => {
    const td = el("td", {title: v === null ? "no traffic" : labels[r] + " -> " + labels[c] + ": " + v + " s/GB"},
                  v === null ? "" : (v / base).toFixed(1));
    if (v !== null) {
      const x = Math.max(0, Math.min(1, (v / base - 1) / 3));  // 1x: green .. 4x+: red
      td.style.background = "hsl(" + Math.round(120 - 120 * x) + ",70%," + (85 - 25 * x) + "%)";
    }
    if (focus[0] === r && focus[1] === c) td.classList.add("focus");
    return td;
  })));
  return el("div", {}, el("h2", {}, "Latency heatmap (network time per byte, x the job's baseline " +
                          base.toPrecision(3) + " s/GB)"),
            el("table", {class: "heat"}, el("thead", {}, head), el("tbody", {}, ...rows)));
}
function renderIncident(inc) {
  const box = document.getElementById("incident");
  const parts = [el("h2", {}, "Incident " + inc.id + ": " + inc.class + " (" + inc.state + ")"),
    el("div", {}, el("p", {}, inc.summary || ""),
      el("p", {class: "muted"}, "job " + (inc.job || "-") + " | first symptom " + when(inc.first_symptom) +
        " | detected " + when(inc.detected) + " | localised " + when(inc.localised) +
        " | resolved " + when(inc.resolved)))];
  parts.push(el("div", {}, el("h2", {}, "Suspects"), el("table", {id: "suspects"},
    el("thead", {}, el("tr", {}, el("th", {}, "kind"), el("th", {}, "name"), el("th", {}, "host"),
                       el("th", {}, "confidence"))),
    el("tbody", {}, ...(inc.suspects || []).map(s => el("tr", {}, el("td", {}, s.kind),
      el("td", {}, s.id), el("td", {}, s.host || "-"),
      el("td", {}, Math.round(s.confidence * 100) + "%")))))));
  if (inc.matrix) parts.push(heatmap(inc.matrix, (inc.evidence || {}).baseline_s_per_gb));
  const alerts = Object.entries(inc.alerts || {});
  if (alerts.length) parts.push(el("div", {}, el("h2", {}, "Alerts"), el("table", {},
    el("tbody", {}, ...alerts.map(([name, a]) => el("tr", {}, el("td", {}, name),
      el("td", {}, a.sent + " sent"), el("td", {}, a.failed + " failed"),
      el("td", {}, a.last_error || "")))))));
  parts.push(el("div", {}, el("h2", {}, "Evidence"), el("pre", {}, JSON.stringify(inc.evidence, null, 1))));
  box.replaceChildren(...parts);
}
function pct(v) { return v === null || v === undefined ? "?" : Math.round(v * 100) + "%"; }
async function renderPlan() {
  const box = document.getElementById("plan");
  let plan;
  try { plan = await get("/api/v1/plan"); } catch (e) { box.hidden = true; return; }  // planning off
  box.hidden = false;
  const p = plan.proposal;
  document.getElementById("plan-summary").textContent = !p ? plan.flows + " flows, no proposal yet" :
    plan.flows + " flows (" + p.planned + " planned); busiest link now " + pct(p.current_max_util) +
    ", planned " + pct(p.proposed_max_util) + "; " + p.moved + " would move (" + p.reason + ")";
  fill(document.querySelector("#plan-links tbody"), (p ? p.links : []).slice(0, 8).map(l =>
    el("tr", {}, el("td", {}, l.link), el("td", {}, l.from + " -> " + l.to),
      el("td", {}, pct(l.current)), el("td", {}, pct(l.proposed)),
      el("td", {class: l.health === "ok" ? "" : "open"}, l.health))));
  const last = plan.last_plan;
  document.getElementById("plan-last").textContent = !last ? "no plan applied yet" :
    "last plan " + last.id + " (" + last.reason + ", " + when(last.created) + "): " +
    last.applied + " of " + last.assignments + " applied, " + last.failed.length + " failed, " +
    last.waiting.length + " waiting";
}
async function refresh() {
  try {
    const [hosts, incs] = await Promise.all([get("/api/v1/hosts"), get("/api/v1/incidents")]);
    const list = incs.incidents;
    const m = /^#incident-(\\d+)$/.exec(location.hash);
    selected = m ? Number(m[1]) : (list.find(i => i.state !== "resolved") || list[0] || {}).id ?? null;
    renderHosts(hosts.hosts);
    const open = renderIncidents(list);
    const silent = hosts.hosts.filter(h => h.status !== "up").length;
    document.getElementById("summary").textContent = hosts.hosts.length + " hosts (" + silent +
      " silent), " + open + " open incidents, updated " + new Date().toLocaleTimeString();
    if (selected !== null) renderIncident(await get("/api/v1/incidents/" + selected));
    await renderPlan();
  } catch (e) {
    document.getElementById("summary").textContent = "error: " + e.message;
  }
}
window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, 5000);
</script></body></html>
"""
