"""What a lab's aggregator says over its HTTP API, for the lab's demo, benchmarks and root tests:
incidents, C4P's plan view, and whether C4D and C4P are at rest before a fault is injected."""
from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

from .state import LabState

# C4P's hold-down after a plan (aggregator.toml [planning] settle_s; the lab keeps the default)
SETTLE_S = 30.0
# how long `at_rest` must hold: two periodic proposals (the lab's interval_s, 10 s), long
# enough for young flows (all noise to the planner) to be measured and a gaining plan applied
REST_HOLD_S = 20.0


def get(st: LabState, path: str) -> Any:
    with urllib.request.urlopen(st.api + path, timeout=10) as r:
        return json.loads(r.read())


def incidents(st: LabState, state: str | None = None) -> list[dict[str, Any]]:
    return list(get(st, "/api/v1/incidents" + (f"?state={state}" if state else ""))["incidents"])


def top(inc: dict[str, Any]) -> dict[str, Any]:
    """An incident's first suspect ({} when it names none)."""
    return inc["suspects"][0] if inc.get("suspects") else {}


def plan_view(st: LabState) -> dict[str, Any]:
    return dict(get(st, "/api/v1/plan"))


def at_rest(view: dict[str, Any], now: float) -> bool:
    """Whether C4P is done moving the job: applying on its own, it knows what the links carry
    now, its proposal would not be applied, and the last plan's connections have all
    reconnected and settled; with auto-apply off, at once."""
    if not view.get("auto_apply"):
        return True
    p, last = view.get("proposal"), view.get("last_plan")
    if p is None or p["current_max_util"] is None or p["gains"]:
        return False
    return last is None or (not last["waiting"] and now - last["created"] >= SETTLE_S)


def wait_rest(st: LabState, timeout: float, hold_s: float = REST_HOLD_S
              ) -> tuple[bool, float, dict[str, Any], list[dict[str, Any]]]:
    """Wait until C4P is `at_rest` and no incident is open, both for `hold_s`, at most
    `timeout`: a fault injected then must not race a periodic plan that moves the job off its
    component (a flap on a link a plan had just emptied opened no incident in CI), nor share
    the stage with an incident opened before it. (reached, seconds waited, the plan view,
    the incidents not resolved)."""
    t0 = time.monotonic()
    since: float | None = None
    while True:
        view = plan_view(st)
        open_ = [i for i in incidents(st) if i.get("state") != "resolved"]
        now = time.monotonic()
        since = (since or now) if at_rest(view, time.time()) and not open_ else None
        if since is not None and now - since >= hold_s:
            return True, now - t0, view, open_
        if now - t0 >= timeout:
            return False, now - t0, view, open_
        time.sleep(1.0)
