"""Parsing `rdma -j -d res show qp` (iproute2) output and running the tool."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from c4.agent.rdma_tool import (NO_RDMA, NetlinkQp, RdmaToolError, list_qps, parse_qps)


def test_parses_kernel_and_user_qps_of_two_devices(fixtures: Path) -> None:
    listing = parse_qps((fixtures / "rdma/res_qp_mlx5.json").read_text())
    assert listing.rejected == []
    assert len(listing.qps) == 6
    gsi = [q for q in listing.qps if q.qp_type == "GSI"]
    assert [(q.dev, q.lqpn, q.pid, q.comm) for q in gsi] == [
        ("mlx5_0", 1, None, "ib_core"), ("mlx5_1", 1, None, "ib_core")]
    nccl = listing.qps[1]
    assert nccl == NetlinkQp(dev="mlx5_0", port=1, lqpn=0x1FD2, rqpn=0x423C, qp_type="RC",
                             state="RTS", pid=48211, comm="python")
    assert listing.qps[2].state == "ERR"
    reset = listing.qps[3]
    assert reset.port is None and reset.state == "RESET"  # not bound to a port yet
    ud = listing.qps[5]
    assert ud.rqpn is None and ud.qp_type == "UD"


def test_bad_objects_are_rejected_with_reasons_and_the_rest_kept(fixtures: Path) -> None:
    listing = parse_qps((fixtures / "rdma/res_qp_malformed.json").read_text())
    assert [q.lqpn for q in listing.qps] == [1]
    assert len(listing.rejected) == 5
    joined = "\n".join(listing.rejected)
    for reason in ("qp[1]: lqpn=None", "qp[2]: port=-1", "qp[3]: lqpn='13'",
                   "qp[4]: expected an object", "qp[5]: ifname=''"):
        assert reason in joined


@pytest.mark.parametrize("text", ["", "\n", "[]\n"])
def test_no_qps(text: str) -> None:
    assert parse_qps(text).qps == []


@pytest.mark.parametrize("text,needle", [("{\"a\": 1}", "JSON dict"), ("[{", "invalid JSON")])
def test_output_that_is_not_an_array_is_an_error(text: str, needle: str) -> None:
    with pytest.raises(RdmaToolError, match=needle):
        parse_qps(text)


def test_runs_the_command_and_parses_its_stdout(fixtures: Path) -> None:
    listing = list_qps(["cat", str(fixtures / "rdma/res_qp_mlx5.json")])
    assert [q.lqpn for q in listing.qps] == [1, 0x1FD2, 0x1FD3, 0x1FD4, 1, 0x1234]


def test_no_rdma_subsystem_means_no_qps() -> None:
    listing = list_qps(["sh", "-c", f"echo '{NO_RDMA}' >&2; exit 1"])
    assert listing.qps == [] and listing.rejected == []


def test_other_failures_raise_with_the_reason() -> None:
    with pytest.raises(RdmaToolError, match="exited 255: rdma: bad object"):
        list_qps(["sh", "-c", "echo 'rdma: bad object' >&2; exit 255"])
    with pytest.raises(RdmaToolError, match="not found"):
        list_qps(["/nonexistent/rdma", "-j"])
    with pytest.raises(RdmaToolError, match="did not finish"):
        list_qps(["sleep", "5"], timeout=0.2)


@pytest.mark.skipif(shutil.which("rdma") is None, reason="iproute2 rdma is not installed")
def test_real_rdma_tool_lists_or_reports_no_rdma() -> None:
    """On this machine's kernel: either its QPs (RDMA host) or an empty list (no ib_core)."""
    proc = subprocess.run(["rdma", "-j", "-d", "res", "show", "qp"], capture_output=True,
                          text=True)
    listing = list_qps()
    if proc.returncode != 0:
        assert NO_RDMA in proc.stderr and listing.qps == []
    else:
        assert listing.qps == parse_qps(proc.stdout).qps
