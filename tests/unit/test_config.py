"""Config files: defaults, every mistake named with its key, collector options."""
from __future__ import annotations

from pathlib import Path

import pytest

from c4.core import config
from c4.core.config import ConfigError

from c4.agent.config import AgentConfig
from c4.aggregator.config import AggregatorConfig


def _load(tmp_path: Path, cls, text: str):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return config.load(cls, p)


def test_defaults_without_a_file() -> None:
    cfg = config.load(AgentConfig, None)
    assert cfg.interval == 1.0 and cfg.sysfs_root == Path("/sys")
    assert "rdma" in cfg.enabled
    agg = config.load(AggregatorConfig, None)
    assert agg.api.startswith("127.0.0.1:")  # the API is local unless asked otherwise


def test_values_and_collector_options(tmp_path: Path) -> None:
    cfg = _load(tmp_path, AgentConfig, 'interval = 2\nsysfs_root = "/x"\n'
                '[collectors]\nenabled = ["host"]\n[collectors.tcp_flows]\nports = [29500]\n')
    assert cfg.interval == 2.0 and cfg.sysfs_root == Path("/x")
    assert cfg.enabled == ["host"] and cfg.options("tcp_flows") == {"ports": [29500]}


@pytest.mark.parametrize("text,needle", [
    ("intervall = 1\n", "unknown key(s) intervall"),
    ('interval = "fast"\n', "interval: expected a number"),
    ("interval = 0\n", "interval: must be between"),
    ('aggregator = "localhost:9465"\n', "aggregator: expected a ZeroMQ endpoint"),
    ('[collectors]\nenabled = ["hots"]\n', "unknown collector 'hots'"),
    ("[collectors]\nrdma = 3\n", "collectors.rdma: expected a table"),
    ("interval = [\n", "not valid TOML"),
])
def test_agent_config_errors_name_the_key(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        _load(tmp_path, AgentConfig, text)
    assert needle in str(exc.value) and "c.toml" in str(exc.value)


def test_aggregator_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api: expected host:port"):
        _load(tmp_path, AggregatorConfig, 'api = "9464"\n')
    with pytest.raises(ConfigError, match="no such config file"):
        config.load(AggregatorConfig, tmp_path / "missing.toml")
    p = tmp_path / "bin.toml"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read|not valid TOML"):
        config.load(AggregatorConfig, p)
