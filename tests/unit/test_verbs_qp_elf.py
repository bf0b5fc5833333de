"""Symbol resolution picks the default version, as the dynamic linker does."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from c4.agent.elf_symbols import ElfError, elf_machine, find_function
from tests.verbs import harness

SYSTEM_LIB = Path("/lib/x86_64-linux-gnu/libibverbs.so.1")
VERBS = ("ibv_create_qp", "ibv_modify_qp", "ibv_destroy_qp")


@pytest.fixture(scope="module")
def test_library() -> Path:
    harness.require("build/libibverbs-c4test.so")
    return harness.LIBRARY


def readelf_versions(lib: Path, name: str) -> dict[str, int]:
    """version text ('@@IBVERBS_1.1', '@IBVERBS_1.0') -> address, by binutils' readelf."""
    if shutil.which("readelf") is None:
        pytest.skip("binutils readelf is not installed")
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(lib)], capture_output=True,
                         text=True, check=True).stdout
    return {m[2]: int(m[1], 16) for m in re.finditer(
        rf"^\s*\d+: ([0-9a-f]+)\s+\d+ FUNC .* {name}(@@?[\w.]+)$", out, re.M)}


@pytest.mark.parametrize("name", VERBS)
def test_default_version_of_the_test_library(test_library: Path, name: str) -> None:
    sym = find_function(test_library, name)
    versions = readelf_versions(test_library, name)
    assert set(versions) == {"@@IBVERBS_1.1", "@IBVERBS_1.0"}  # both exported, like rdma-core
    assert (sym.version, sym.address) == ("IBVERBS_1.1", versions["@@IBVERBS_1.1"])
    assert sym.size > 0


@pytest.mark.skipif(not SYSTEM_LIB.exists(), reason="no system libibverbs.so.1")
@pytest.mark.parametrize("name", VERBS)
def test_default_version_of_the_real_libibverbs(name: str) -> None:
    sym = find_function(SYSTEM_LIB, name)
    assert (sym.version, sym.address) == (
        "IBVERBS_1.1", readelf_versions(SYSTEM_LIB, name)["@@IBVERBS_1.1"])


def test_other_and_missing_symbols(test_library: Path) -> None:
    assert find_function(test_library, "ibv_alloc_pd").version == "IBVERBS_1.1"
    with pytest.raises(ElfError, match="does not export a default version of ibv_post_send"):
        find_function(test_library, "ibv_post_send")
    with pytest.raises(ElfError, match="does not export"):
        find_function(test_library, "c4test_create_qp_1_1")  # local: hidden by the map


def test_not_an_elf(tmp_path: Path) -> None:
    bogus = tmp_path / "libibverbs.so.1"
    bogus.write_text("INPUT(-libverbs)\n")  # a linker script, as some -dev packages ship
    with pytest.raises(ElfError, match="not an ELF"):
        find_function(bogus, "ibv_create_qp")
    with pytest.raises(ElfError, match="No such file"):
        elf_machine(tmp_path / "missing.so")


def test_truncated_library(tmp_path: Path, test_library: Path) -> None:
    data = test_library.read_bytes()
    cut = tmp_path / "libibverbs.so.1"
    for size in (200, len(data) // 2, len(data) - 64):
        cut.write_bytes(data[:size])
        with pytest.raises(ElfError):
            find_function(cut, "ibv_modify_qp")
