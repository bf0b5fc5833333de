"""The HTTP API against its OpenAPI description (aggregator/openapi.py, docs/openapi.json):
schemathesis generates requests from it, including malformed ids and query values, against a
live aggregator on loopback and checks every answer (no 5xx, documented status codes, content
types and response schemas). Bounded examples keep it under a minute."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.openapi import spec
from c4.aggregator.server import Server
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import free_port, serving

REPO = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-schemathesis-only"


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Server]:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    token.chmod(0o600)
    cfg = AggregatorConfig(listen=f"tcp://127.0.0.1:{free_port()}", api="127.0.0.1:0",
                           db=tmp_path / "c4.db", insecure=True, api_token_file=str(token))
    srv = Server(cfg)
    with srv.lock:  # a host to read, so host routes answer 200 as well as 404
        srv.core.ingest.handle(wire.encode(Frame(
            "report", "gpu-01", "b1", 1, 1.0, {"interval": 1.0, "health": {}})), 1.0)
    with serving(srv):
        yield srv


def test_docs_copy_is_current() -> None:
    kept = json.loads((REPO / "docs" / "openapi.json").read_text())
    assert kept == json.loads(json.dumps(spec())), \
        "docs/openapi.json is stale: python -m c4.aggregator.openapi > docs/openapi.json"


def test_api_conforms_to_its_openapi_description(live: Server, tmp_path: Path) -> None:
    st = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if st is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[test]')")
    host, port = live.httpd.server_address[:2]
    base = f"http://{host}:{port}"
    out = subprocess.run(
        [st, "run", f"{base}/api/v1/openapi.json", "--url", base, "--checks", "all",
         "--max-examples", "25", "--seed", "10", "--request-timeout", "10",
         "-H", f"Authorization: Bearer {TOKEN}", "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    (tmp_path / "schemathesis.txt").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, out.stdout[-8000:] + out.stderr[-2000:]
