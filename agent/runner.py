"""Each collector on a thread of its own, so one slow `collect()` (a BPF map read under load, a
hung sysfs file) delays only its own section, never the others' interval.

The agent asks every runner once per interval and waits until `deadline`; a collector still
busy then is reported unhealthy for this interval ("slow") and is not asked again until it
returns; what it returns late goes into the next report, and it is asked again the interval
after. A collector is only ever called from
its own thread, one call at a time, so collectors need no locks of their own.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from .collectors import Collector, Sample


@dataclass
class Outcome:
    sample: Sample | None
    error: BaseException | None
    duration_s: float


class CollectorRunner:
    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.name = collector.name
        self._ask = threading.Condition()
        self._now: float | None = None
        self._busy_since: float | None = None
        self._done: Outcome | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"c4-collect-{self.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._ask:
                while self._now is None and not self._closed:
                    self._ask.wait()
                if self._closed:
                    return
                now = self._now
                self._now = None
            t0 = time.perf_counter()
            try:
                out = Outcome(self.collector.collect(now), None, 0.0)  # type: ignore[arg-type]
            except Exception as exc:  # reported as this collector's health, never raised
                out = Outcome(None, exc, 0.0)
            out.duration_s = time.perf_counter() - t0
            with self._ask:
                self._done = out
                self._busy_since = None
                self._ask.notify_all()

    def request(self, now: float) -> bool:
        """Ask for a sample; False while the previous call has not returned, or has returned
        late and its outcome is not taken yet: that one fills this interval, and the next
        request is on time again (asking now would leave every later report one call behind)."""
        with self._ask:
            if self._busy_since is not None or self._done is not None:
                return False
            self._busy_since = time.monotonic()
            self._now = now
            self._ask.notify_all()
            return True

    def busy_for(self) -> float:
        with self._ask:
            return 0.0 if self._busy_since is None else time.monotonic() - self._busy_since

    def wait(self, deadline: float) -> Outcome | None:
        """The finished outcome (taken), or None if still running at `deadline` (monotonic)."""
        with self._ask:
            while self._done is None and self._busy_since is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._ask.wait(left)
            out, self._done = self._done, None
            return out

    def close(self, timeout: float = 2.0) -> None:
        with self._ask:
            self._closed = True
            self._ask.notify_all()
        self._thread.join(timeout)
