"""Every subcommand documents itself; every query subcommand speaks JSON; errors are clear."""
from __future__ import annotations

import subprocess
import sys

import pytest

from c4.cli import COMMANDS, build_parser
from tests.e2e.procs import free_port

QUERIES = ("hosts", "host", "incidents", "incident", "replay")


def _subparsers(parser):
    for action in parser._actions:
        if action.__class__.__name__ == "_SubParsersAction":
            return action.choices
    return {}


def test_every_subcommand_has_help() -> None:
    top = _subparsers(build_parser())
    assert set(COMMANDS) <= set(top)
    undescribed = [f"{name} {sub_name}".strip()
                   for name, p in top.items()
                   for sub_name, sp in [("", p), *_subparsers(p).items()]
                   if not (sp.description or "").strip()]
    assert not undescribed, f"subcommands without a --help description: {undescribed}"


def test_query_subcommands_have_json() -> None:
    top = _subparsers(build_parser())
    for name in QUERIES:
        opts = {o for a in top[name]._actions for o in a.option_strings}
        assert "--json" in opts, name


@pytest.mark.parametrize("args", [["hosts"], ["host", "x"], ["incidents"]])
def test_unreachable_aggregator_is_a_clear_error(args: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    out = subprocess.run([sys.executable, "-m", "c4.cli", *args, "--aggregator", url],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cannot reach the aggregator" in out.stderr and "Traceback" not in out.stderr


def test_bad_config_exits_2_with_the_key(tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text("interval = -1\n")
    out = subprocess.run([sys.executable, "-m", "c4.cli", "agent", "run", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "interval" in out.stderr


def test_aggregator_port_in_use_is_a_clear_error(tmp_path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = tmp_path / "aggregator.toml"
        cfg.write_text(f'listen = "tcp://127.0.0.1:{port}"\napi = "127.0.0.1:{free_port()}"\n'
                       f'db = "{tmp_path / "c4.db"}"\ninsecure = true\n')
        out = subprocess.run([sys.executable, "-m", "c4.cli", "aggregator", "run", "--config",
                              str(cfg)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cannot start the aggregator" in out.stderr and "Traceback" not in out.stderr


def test_cli_reference_documents_every_flag() -> None:
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    missing = []

    def walk(parser, path: str) -> None:
        for action in parser._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt not in ("--help", "--version") and opt not in doc:
                    missing.append(f"{path} {opt}")
        for name, sub in _subparsers(parser).items():
            if f"c4 {path} {name}".replace("c4  ", "c4 ").strip() not in doc:
                missing.append(f"{path} {name} (no section)")
            walk(sub, f"{path} {name}".strip())

    walk(build_parser(), "")
    assert not missing, f"docs/cli.md lacks: {missing}"


def test_agent_with_an_unusable_endpoint_is_a_clear_error(tmp_path) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('aggregator = "tcp://no such host:port"\ninsecure = true\n'
                   '[collectors]\nenabled = ["host"]\n')
    out = subprocess.run([sys.executable, "-m", "c4.cli", "agent", "run", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "cannot start the agent" in out.stderr and "Traceback" not in out.stderr
