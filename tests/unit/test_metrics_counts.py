"""/metrics counts incidents and actions off the aggregator lock (issue 15): on a connection of
its own, so a scrape's table scans neither wait for ingest nor hold it up; the counts include
what other connections (the actions worker's) committed."""
from __future__ import annotations

import sqlite3
import urllib.request


from c4.aggregator.server import Server


def _scrape(srv: Server) -> dict[str, float]:
    host, port = srv.httpd.server_address[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines()
                                     if line and not line.startswith("#"))}


def test_incident_and_action_counts_are_not_read_under_the_lock(server: Server) -> None:
    other = sqlite3.connect(server.cfg.db, isolation_level=None)  # as the actions worker writes
    for cls, state in (("comm_slow", "open"), ("comm_slow", "open"), ("nic_down", "resolved")):
        other.execute("INSERT INTO incidents (class, state, summary, suspects, evidence, "
                      "first_symptom, detected, updated, actions, keys, last_active, hold_s) "
                      "VALUES (?, ?, '', '[]', '[]', 0, 0, 0, '[]', '[]', 0, 0)", (cls, state))
    other.execute("INSERT INTO actions (incident, action, target, backend, command, dry_run, "
                  "outcome, detail, stderr, duration_s, ts) "
                  "VALUES (1, 'drain', 'h1', 'x', '', 1, 'dry-run', '', '', 0, 0)")
    other.close()
    on_ingest_conn: list[str] = []  # every use of the ingest connection is under the lock
    server.core.store.conn.set_trace_callback(on_ingest_conn.append)
    try:
        m = _scrape(server)
    finally:
        server.core.store.conn.set_trace_callback(None)
    assert m['c4_incidents{class="comm_slow",state="open"}'] == 2
    assert m['c4_incidents{class="nic_down",state="resolved"}'] == 1
    assert m['c4_actions_total{action="drain",result="dry_run"}'] == 1
    assert not [q for q in on_ingest_conn if "GROUP BY" in q]
