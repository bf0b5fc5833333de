"""Build the verbs test target (Makefile here) and drive qp_driver from Python; shared by the
tests and bench/verbs_qp_overhead.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

VERBS_DIR = Path(__file__).resolve().parent
BUILD = VERBS_DIR / "build"
LIBRARY = BUILD / "libibverbs-c4test.so"
DRIVER = BUILD / "qp_driver"
VERBS_H = Path("/usr/include/infiniband/verbs.h")


def missing_toolchain() -> str | None:
    """Why the C test target cannot be built here, or None."""
    for tool in ("make", "gcc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not VERBS_H.exists():
        return f"{VERBS_H} is missing (install libibverbs-dev)"
    return None


def build(*targets: str) -> None:
    """make -C tests/verbs <targets> (one job: the machine is shared); raises with make's
    output on failure."""
    proc = subprocess.run(["make", "-j1", "-C", str(VERBS_DIR), *targets],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"make -C {VERBS_DIR} failed:\n{proc.stdout}{proc.stderr}")


def require(*targets: str) -> None:
    """For test fixtures: skip when the toolchain is missing, else build `targets`."""
    why = missing_toolchain()
    if why:
        import pytest

        pytest.skip(why)
    build(*targets)


class Driver:
    """A running qp_driver; `send` writes one command and returns its reply line."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        """`args`: e.g. ("--dlopen", LIB) to resolve the verbs as NCCL does; `env`: the
        driver's whole environment (default: ours)."""
        self.proc = subprocess.Popen([str(DRIVER), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
        self.pid = self.proc.pid

    def send(self, line: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply:
            raise RuntimeError(f"qp_driver exited on {line!r} (rc {self.proc.poll()})")
        return reply

    def ok(self, line: str) -> str:
        reply = self.send(line)
        if not reply.startswith("ok"):
            raise RuntimeError(f"qp_driver: {line!r} -> {reply!r}")
        return reply

    def close(self) -> int:
        """End of input: the driver exits, leaving any QP it still holds undestroyed."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout:
                self.proc.stdout.close()
