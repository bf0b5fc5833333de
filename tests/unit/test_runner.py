"""agent/runner.py: a collector on its own thread, late calls and catching up."""
from __future__ import annotations

import threading
import time
from typing import Any, Mapping

from c4.agent.collectors import Collector, Context, Sample
from c4.agent.runner import CollectorRunner


class Gated(Collector):
    name = "host"

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        self.gate = threading.Event()

    def collect(self, now: float) -> Sample:
        self.gate.wait(5)
        return Sample({"now": now}, [])


def test_after_a_late_call_the_reports_catch_up() -> None:
    c = Gated(Context("h"), {})
    r = CollectorRunner(c)
    try:
        r.request(1.0)
        assert r.wait(time.monotonic() + 0.05) is None  # slow: the interval goes without it
        c.gate.set()
        got = []
        for now in (2.0, 3.0, 4.0):
            time.sleep(0.05)  # the collector finishes well within each interval
            r.request(now)
            out = r.wait(time.monotonic() + 1.0)
            assert out is not None and out.sample is not None
            got.append(out.sample.section["now"])
        # the late sample fills the next interval, then every report carries its own call
        assert got == [1.0, 3.0, 4.0]
    finally:
        c.gate.set()
        r.close()
