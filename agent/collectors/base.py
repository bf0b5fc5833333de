"""The collector interface. A collector reads one source of signals on the host and returns,
each interval, its report section and any discrete events.

The outside world is injected through `Context` (sysfs/proc/dev roots, run directory, clock),
so the same collector runs on a GPU host and against fixture trees in tests.
"""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping


class CollectorUnavailable(RuntimeError):
    """Raised by `start()` when a feature this collector needs is missing (no tracepoint, no
    BTF, no headers, no permission, no device). The agent disables the collector, logs the
    reason once and reports it in `hello.collectors` and `report.health`."""


class OptionError(ValueError):
    """A collector option in the config is wrong; the message names the key."""


@dataclass(frozen=True)
class Context:
    host: str
    sysfs_root: Path = Path("/sys")
    proc_root: Path = Path("/proc")
    dev_root: Path = Path("/dev")
    run_dir: Path = Path("/run/c4")
    clock: Callable[[], float] = time.time
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("c4.agent"))


@dataclass
class Event:
    """A discrete occurrence; becomes one `event` frame (docs/wire.md). `type` must be
    registered in c4/core/wire/sections/<collector>.py EVENTS with the schema of `attrs`."""

    type: str
    severity: str  # info | warning | error | critical
    attrs: dict[str, Any]
    msg: str = ""
    device: str | None = None

    def body(self) -> dict[str, Any]:
        b: dict[str, Any] = {"type": self.type, "severity": self.severity, "attrs": self.attrs}
        if self.msg:
            b["msg"] = self.msg
        if self.device is not None:
            b["device"] = self.device
        return b


@dataclass
class Sample:
    section: Any = None  # report.body[<collector name>]; None: nothing this interval
    events: list[Event] = field(default_factory=list)
    # the section as msgpack, if the collector encoded it (to size it): sent as it is, not
    # encoded again (wire.encode's `raw`)
    encoded: bytes | None = None


class Collector(ABC):
    name: ClassVar[str]  # config name and report section key
    # Fed by other processes (the plugin socket): its section and events are checked against
    # the wire schema every interval, and a bad one is dropped alone (the report still goes).
    untrusted: ClassVar[bool] = False

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        self.ctx = ctx
        self.options = dict(options)

    def start(self) -> None:  # noqa: B027  # optional hook: most collectors need nothing
        """Acquire resources (load BPF, open files). Raise CollectorUnavailable(reason)."""

    @abstractmethod
    def collect(self, now: float) -> Sample:
        """Called once per interval from the agent's loop; must not block for long."""

    def inventory(self) -> dict[str, Any] | None:
        """Fields merged into the `hello` body (e.g. `nics`), or None."""
        return None

    def close(self) -> None:  # noqa: B027  # optional hook
        """Release resources; called once on stop."""
