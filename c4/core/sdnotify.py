"""systemd's service notification protocol (sd_notify(3)), for Type=notify units with
WatchdogSec=: READY=1 once serving, STATUS=<line> for `systemctl status`, WATCHDOG=1 pings from
the main loop (a wedged loop stops pinging and systemd restarts the service), STOPPING=1.

The protocol is one datagram of newline-separated assignments to the AF_UNIX socket named by
$NOTIFY_SOCKET (a path, or `@name` for the abstract namespace). systemd passes the watchdog
period as $WATCHDOG_USEC and, when set, $WATCHDOG_PID names the process meant to ping. Outside
systemd the variables are absent and every call is a no-op.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Callable, Mapping


class Notifier:
    def __init__(self, environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        env = os.environ if environ is None else environ
        self.clock = clock
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        self.watchdog_s = 0.0
        usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self._last_ping = float("-inf")

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def ping_every(self) -> float:
        """Longest wait the main loop may make between pings: a quarter of the watchdog
        period, so pings land at most half a period apart (sd_watchdog_enabled(3) asks for
        half); infinite without a watchdog."""
        return self.watchdog_s / 4 if self.watchdog_s else float("inf")

    def send(self, **fields: str | int) -> bool:
        """Send `KEY=value` lines (keys upper-cased); False when not under systemd or the
        socket refuses (systemd gone: nothing to do about it but carry on)."""
        if not self.address:
            return False
        msg = "\n".join(f"{k.upper()}={v}" for k, v in fields.items()).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(msg, self.address)
        except OSError:
            return False
        return True

    def ready(self, status: str) -> None:
        self.send(ready=1, status=status, mainpid=os.getpid())

    def status(self, status: str) -> None:
        self.send(status=status)

    def watchdog(self) -> None:
        """Ping if the watchdog is on and a quarter period passed since the last ping."""
        if self.watchdog_s and self.clock() - self._last_ping >= self.watchdog_s / 4:
            self._last_ping = self.clock()
            self.send(watchdog=1)

    def stopping(self, status: str = "stopping") -> None:
        self.send(stopping=1, status=status)
