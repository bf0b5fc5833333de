"""The agent's C4P duties, as the daemon's loop sees them: answer `probe` with `probe_result`
(agent/probe.py) and `plan` with `plan_result` (agent/pathctl.py).

Both run off the loop's thread (a silent hop or a slow process must not delay reports); the loop
polls more often while work is outstanding and sends what `ready()` returns.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from c4.core.wire import Frame

from .pathctl import PathControl
from .probe import Prober, ProbeWorker

log = logging.getLogger("c4.agent")
BUSY_POLL = 0.02  # seconds between checks while a probe or a plan is in flight


class Planning:
    def __init__(self, run_dir: Path, *, plan_deadline: float = 2.0,
                 tcp_wait: float = 30.0) -> None:
        self.pathctl = PathControl(run_dir, deadline=plan_deadline, tcp_wait=tcp_wait)
        self.unavailable: str | None = None
        self.prober: ProbeWorker | None = None
        self._ready: list[tuple[str, dict[str, Any]]] = []

    def start(self) -> None:
        try:
            self.pathctl.start()
        except OSError as exc:
            self.unavailable = f"path-control socket {self.pathctl.path}: {exc.strerror or exc}"
            log.warning("plans cannot be applied: %s", self.unavailable)
        self.prober = ProbeWorker(Prober())

    def on_plan(self, frame: Frame) -> None:
        if self.unavailable is None:
            self.pathctl.submit(frame.body)
            return
        self._ready.append(("plan_result", {
            "plan_id": frame.body["plan_id"], "applied": [],
            "failed": [{"id": a["id"], "reason": self.unavailable[:512]}
                       for a in frame.body["assignments"]]}))

    def on_probe(self, frame: Frame) -> None:
        assert self.prober is not None
        self.prober.submit(frame.body)

    def poll_interval(self) -> float | None:
        """How soon the loop should come back, or None when nothing is in flight."""
        busy = self._ready or self.pathctl.pending() or (self.prober and self.prober.pending())
        return BUSY_POLL if busy else None

    def ready(self) -> list[tuple[str, dict[str, Any]]]:
        """(kind, body) frames to send now."""
        out, self._ready = self._ready, []
        if self.unavailable is None:
            out += [("plan_result", b) for b in self.pathctl.results()]
        if self.prober is not None:
            out += [("probe_result", b) for b in self.prober.results()]
        return out

    def close(self) -> None:
        if self.prober is not None:
            self.prober.close()
        self.pathctl.close()
