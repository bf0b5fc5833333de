"""Feature detection from tracepoint format files (captured from Linux 6.18; older kernels
are the same files with the fields they lack removed)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from c4.agent.collectors.base import CollectorUnavailable
from c4.agent.collectors.tcp_flows import detect_features, read_format


@pytest.fixture
def tracefs(fixtures: Path, tmp_path: Path) -> Path:
    root = tmp_path / "tracing"
    shutil.copytree(fixtures / "tcp_flows" / "tracefs", root)
    return root


def drop_field(tracefs: Path, tp: str, field: str) -> None:
    path = tracefs / "events" / tp / "format"
    text = path.read_text()
    path.write_text(re.sub(rf"\n\s*field:[^\n]*\b{field}(\[\d+\])?;[^\n]*", "", text))


def test_this_kernel_has_everything(tracefs: Path) -> None:
    f = detect_features(tracefs, "6.18.44", 4096)
    assert set(f.names) == {"ringbuf", "cookie", "retrans_err", "drop_reason", "rx_sk",
                            "send_reset", "receive_reset", "sock_length", "zero_window", "rto"}
    assert "-DC4_MAX_FLOWS=4096" in f.cflags and "-DC4_RINGBUF" in f.cflags
    assert {"-DC4_HAVE_RST_REASON", "-DC4_HAVE_RECEIVE_RESET_COOKIE"} <= set(f.cflags)
    # names come from the kernel's own print format, not from (older) headers
    assert f.drop_reasons[12] == "NETFILTER_DROP" and f.drop_reasons[2] == "NOT_SPECIFIED"
    assert f.rst_reasons[1] == "NO_SOCKET"


def test_optional_fields_compile_out(tracefs: Path) -> None:
    drop_field(tracefs, "skb/kfree_skb", "rx_sk")
    drop_field(tracefs, "skb/kfree_skb", "reason")
    drop_field(tracefs, "tcp/tcp_probe", "sock_cookie")
    drop_field(tracefs, "tcp/tcp_probe", "snd_wnd")
    drop_field(tracefs, "tcp/tcp_send_reset", "reason")
    shutil.rmtree(tracefs / "events" / "sock" / "sock_recv_length")
    shutil.rmtree(tracefs / "events" / "tcp" / "tcp_cong_state_set")  # 6.2+
    f = detect_features(tracefs, "5.4.0", 16384)
    assert set(f.names) == {"perf_buffer", "retrans_err", "send_reset", "receive_reset"}
    assert not any(flag in f.cflags for flag in (
        "-DC4_RINGBUF", "-DC4_HAVE_RX_SK", "-DC4_HAVE_KFREE_REASON", "-DC4_HAVE_PROBE_COOKIE",
        "-DC4_HAVE_RST_REASON", "-DC4_HAVE_SOCK_LENGTH", "-DC4_HAVE_PROBE_SND_WND",
        "-DC4_HAVE_CONG_STATE"))
    assert f.drop_reasons == {} and f.rst_reasons == {}


def test_send_reset_with_split_addresses_is_not_used(tracefs: Path) -> None:
    path = tracefs / "events" / "tcp" / "tcp_send_reset" / "format"
    path.write_text(path.read_text().replace("saddr[28];\toffset:32;\tsize:28;",
                                             "saddr[4];\toffset:32;\tsize:4;"))
    assert read_format(tracefs, "tcp/tcp_send_reset").fields["saddr"] == ("__u8", 4)
    assert "send_reset" not in detect_features(tracefs, "5.15.0", 16384).names


@pytest.mark.parametrize("tp, field", [("tcp/tcp_probe", "skaddr"),
                                       ("sock/inet_sock_set_state", "saddr_v6")])
def test_missing_required_field_is_unavailable(tracefs: Path, tp: str, field: str) -> None:
    drop_field(tracefs, tp, field)
    with pytest.raises(CollectorUnavailable, match=rf"{tp} on kernel 5\.15\.0 lacks .*{field}"):
        detect_features(tracefs, "5.15.0", 16384)


def test_missing_tracepoint_is_unavailable(tracefs: Path) -> None:
    shutil.rmtree(tracefs / "events" / "tcp" / "tcp_probe")
    with pytest.raises(CollectorUnavailable, match="lacks tracepoint tcp/tcp_probe"):
        detect_features(tracefs, "4.9.0", 16384)
