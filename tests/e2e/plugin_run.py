"""The real plugin under its C harness, feeding a real `nccl` collector: one helper for the
tests that compare what the plugin sends with what the simulator sends."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from c4.agent.collectors.base import Context, Sample
from c4.agent.collectors.nccl import NcclCollector

REPO = Path(__file__).resolve().parents[2]


def hung_ring(tmp_path: Path, env: dict[str, str] | None = None) -> Sample:
    """A 4-rank ring whose rank 2 never enters an op from 1 s on (summaries with an op in
    flight, stall messages after 0.4 s of it), collected once at 2.2 s."""
    build = tmp_path / "plugin"  # own build dir: plugin/build belongs to whoever runs make
    made = subprocess.run(["make", "-C", str(REPO / "plugin"), f"B={build}",
                           f"{build}/libnccl-profiler-c4.so", f"{build}/harness"],
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    col = NcclCollector(Context(host="h", run_dir=tmp_path / "run"), {})
    col.start()
    try:
        penv = dict(os.environ, C4_AGENT_SOCKET=str(col.path), C4_INTERVAL_MS="200",
                    C4_STALL_MS="400", **(env or {}))
        proc = subprocess.Popen([str(build / "harness"), "--emit-only", "--seconds", "3",
                                 "--ranks", "4", "--hang-rank", "2"], env=penv,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.2)
        sample = col.collect(time.time())
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        col.close()
    return sample
