"""Recorded faults for live aggregators: `c4 sim` makes the recording, `send` delivers its
frames to the ingest socket as the agents sent them, paced by their timestamps."""
from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import zmq

from c4.core import record, wire

from .procs import REPO, Cluster, c4_cmd, env


def simulate(out: Path, fault: str, duration: int) -> Path:
    """4 hosts x 2 GPUs, no clock skew, fixed seed; returns the recording."""
    res = subprocess.run(c4_cmd("sim", "--hosts", "4", "--gpus-per-host", "2", "--duration",
                                str(duration), "--fault", fault, "--max-skew", "0", "--seed", "3",
                                "--out", str(out)),
                         capture_output=True, text=True, env=env(), cwd=REPO, timeout=120)
    assert res.returncode == 0, res.stderr
    return out


def send(cluster: Cluster, rec: Path, stop: threading.Event, speed: float) -> None:
    """One DEALER per host, `speed` simulated seconds per real second (C4D counts its
    evaluations on the aggregator's own clock, so a burst would not do)."""
    frames = [(wire.decode(data), data) for data in record.read(rec)]
    ctx = zmq.Context()
    socks: dict[str, zmq.Socket] = {}
    t0, start = frames[0][0].ts, time.monotonic()
    try:
        for frame, data in frames:
            if stop.wait(max(0.0, start + (frame.ts - t0) / speed - time.monotonic())):
                return
            if frame.host not in socks:
                socks[frame.host] = cluster.dealer(ctx, frame.host)
            socks[frame.host].send(data)
    finally:
        for s in socks.values():
            s.close(linger=1000)
        ctx.term()


def feeding(cluster: Cluster, rec: Path, speed: float) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    t = threading.Thread(target=send, args=(cluster, rec, stop, speed), daemon=True)
    t.start()
    return t, stop
