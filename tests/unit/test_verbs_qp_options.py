"""Options of the verbs_qp collector and discovery of libibverbs."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c4.agent.collectors import Context, OptionError
from c4.agent.collectors.verbs_qp import VerbsQpCollector, find_library
from c4.agent.rdma_tool import DEFAULT_COMMAND
from tests.verbs import harness


def make(**options: object) -> VerbsQpCollector:
    return VerbsQpCollector(Context(host="h"), options)


def test_defaults() -> None:
    c = make()
    assert (c.library, c.pids, c.max_qps, c.max_report, c.netlink) == (None, [], 65536, 1000,
                                                                        True)
    assert c.rdma_command == list(DEFAULT_COMMAND)


def test_valid_options_are_kept() -> None:
    c = make(library="/opt/lib/libibverbs.so.1", pids=[10, 20], max_qps=128, max_report=50,
             netlink=False, rdma_command=["/usr/sbin/rdma", "-j", "res", "show", "qp"])
    assert c.library == Path("/opt/lib/libibverbs.so.1") and c.pids == [10, 20]
    assert (c.max_qps, c.max_report, c.netlink) == (128, 50, False)


@pytest.mark.parametrize("options,key", [
    ({"libary": "/x"}, "collectors.verbs_qp.libary: unknown option"),
    ({"library": 5}, "collectors.verbs_qp.library: expected a path"),
    ({"pids": [1, "2"]}, "collectors.verbs_qp.pids: expected a list of positive"),
    ({"pids": [0]}, "collectors.verbs_qp.pids"),
    ({"pids": 12}, "collectors.verbs_qp.pids: expected a list"),
    ({"max_qps": 0}, "collectors.verbs_qp.max_qps: expected an integer in [1, 1048576], got 0"),
    ({"max_qps": True}, "collectors.verbs_qp.max_qps: expected an integer"),
    ({"max_report": 10001}, "collectors.verbs_qp.max_report"),
    ({"netlink": "yes"}, "collectors.verbs_qp.netlink: expected true or false"),
    ({"rdma_command": []}, "collectors.verbs_qp.rdma_command"),
    ({"rdma_command": ["rdma", 1]}, "collectors.verbs_qp.rdma_command"),
])
def test_bad_options_name_the_key(options: dict, key: str) -> None:
    with pytest.raises(OptionError, match=re.escape(key)):
        make(**options)


def fake_ldconfig(*paths: Path):
    lines = "".join(f"\tlibibverbs.so.1 (libc6,x86-64) => {p}\n" for p in paths)
    out = f"{len(paths)} libs found in cache `/etc/ld.so.cache'\n{lines}" \
          "\tlibc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6\n"

    def run(cmd, **kw):
        assert cmd == ["ldconfig", "-p"]
        return subprocess.CompletedProcess(cmd, 0, out, "")
    return run


@pytest.fixture(scope="module")
def library() -> Path:
    harness.require("build/libibverbs-c4test.so")
    return harness.LIBRARY


def test_ldconfig_entries_that_are_not_elf_are_skipped(tmp_path: Path, library: Path) -> None:
    script = tmp_path / "script" / "libibverbs.so.1"
    script.parent.mkdir()
    script.write_text("INPUT(libibverbs.so.1.14)\n")
    good = tmp_path / "good" / "libibverbs.so.1"
    good.parent.mkdir()
    shutil.copy(library, good)
    assert find_library(fake_ldconfig(script, good)) == good.resolve()


def test_real_ldconfig_finds_the_installed_library() -> None:
    if shutil.which("ldconfig") is None:
        pytest.skip("no ldconfig")
    cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    listed = [Path(line.split("=>")[1].strip()) for line in cache.splitlines()
              if line.strip().startswith("libibverbs.so.1 ")]
    if not listed:
        pytest.skip("libibverbs.so.1 is not installed")
    assert find_library() in {p.resolve() for p in listed}
