"""Loading bpf/*.c with BCC, with the feature checks the bcc tools do first.

Every missing piece (BCC, permission, tracefs, a tracepoint, kernel headers) becomes a
CollectorUnavailable with one clear sentence, so the agent disables that collector and keeps
the others running.
"""
from __future__ import annotations

import os
import platform
from importlib import resources
from pathlib import Path
from typing import Any, Iterable

from .collectors.base import CollectorUnavailable

# bpf/*.c ships as package data of `c4.bpf` (pyproject package-dir), so an installed wheel
# finds its programs without the checkout.
BPF_DIR = Path(str(resources.files("c4.bpf")))
TRACEFS = Path("/sys/kernel/tracing")


def bpf_source(name: str) -> str:
    path = BPF_DIR / name
    try:
        return path.read_text()
    except OSError as exc:
        raise CollectorUnavailable(f"eBPF source {path} is missing: {exc.strerror}") from None


def import_bcc() -> Any:
    try:
        import bcc  # Debian python3-bpfcc, seen through --system-site-packages
    except ImportError:
        raise CollectorUnavailable(
            "BCC is not importable: install Debian/Ubuntu python3-bpfcc and run the agent with "
            "a venv made with --system-site-packages (PyPI 'bcc' is a different project)"
        ) from None
    return bcc


def check_privilege() -> None:
    if os.geteuid() != 0:
        raise CollectorUnavailable("loading eBPF needs root (or CAP_BPF+CAP_PERFMON)")


def check_tracepoints(tracepoints: Iterable[str]) -> None:
    if not (TRACEFS / "events").is_dir():
        raise CollectorUnavailable(f"tracefs is not mounted at {TRACEFS} "
                                   f"(mount -t tracefs tracefs {TRACEFS})")
    missing = [tp for tp in tracepoints if not (TRACEFS / "events" / tp).is_dir()]
    if missing:
        raise CollectorUnavailable(f"kernel {platform.release()} lacks tracepoint(s) "
                                   f"{', '.join(missing)}")


def check_headers() -> None:
    kdir = Path("/lib/modules") / platform.release()
    if not any((kdir / d / "include/linux/kconfig.h").exists() for d in ("build", "source")):
        if not Path("/sys/kernel/kheaders.tar.xz").exists():
            raise CollectorUnavailable(
                f"no kernel headers at {kdir}/build (install linux-headers and link them; "
                "scripts/setup.sh does)")


def load(source_name: str, tracepoints: Iterable[str] = (), cflags: Iterable[str] = ()) -> Any:
    """Compile and load bpf/<source_name>; return the bcc.BPF object."""
    bcc = import_bcc()
    check_privilege()
    check_tracepoints(tracepoints)
    check_headers()
    text = bpf_source(source_name)
    try:
        return bcc.BPF(text=text.encode(), cflags=list(cflags))
    except Exception as exc:  # BCC raises bare Exception on compile/load failure
        raise CollectorUnavailable(f"loading {source_name} failed: {exc}") from None
