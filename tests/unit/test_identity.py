"""Identity pieces in-process: key files, the enrolled-key store, `c4 keys`, the ZAP handler,
ingest's host binding and the API's bearer token. The end-to-end attacks are in
tests/e2e/test_identity.py."""
from __future__ import annotations

import json
import os
import stat
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.auth

from c4.aggregator.api import Api, require_token, serve
from c4.aggregator.auth import ZapHandler, curve_server
from c4.aggregator.ingest import Ingest
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect
from c4.cli import main
from c4.core import keys
from c4.core.keys import ClientKeys, EnrolledKeys, KeyFileError


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_create_writes_an_owner_only_secret(tmp_path: Path) -> None:
    old = os.umask(0)  # a permissive umask must not widen the secret
    try:
        pub, sec = keys.create_pair(tmp_path / "k", "gpu-1")
    finally:
        os.umask(old)
    assert _mode(sec) == 0o600 and _mode(pub) == 0o644 and _mode(tmp_path / "k") == 0o700
    assert sec.stat().st_uid == os.geteuid()
    public, secret = keys.load_secret(sec)
    assert keys.load_public(pub) == public and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(sec) == (public, secret)  # ZeroMQ's own tooling reads it
    with pytest.raises(KeyFileError, match="exists; pass --force"):
        keys.create_pair(tmp_path / "k", "gpu-1")
    keys.create_pair(tmp_path / "k", "gpu-1", force=True)
    assert keys.load_public(pub) != public and _mode(sec) == 0o600


def test_secrets_others_can_read_or_that_are_damaged_are_refused(tmp_path: Path) -> None:
    _, sec = keys.create_pair(tmp_path, "gpu-1")
    sec.chmod(0o640)
    with pytest.raises(KeyFileError, match=f"mode 0640.*chmod 600 {sec}"):
        keys.load_secret(sec)
    sec.chmod(0o600)
    other = keys.create_pair(tmp_path, "gpu-2")[0]
    text = sec.read_text().replace(str(keys.load_public(sec).decode()),
                                   keys.load_public(other).decode())
    sec.write_text(text)
    with pytest.raises(KeyFileError, match="does not belong"):
        keys.load_secret(sec)
    with pytest.raises(KeyFileError, match="no secret-key"):
        keys.load_secret(other)
    with pytest.raises(KeyFileError, match="not a valid host name"):
        keys.create_pair(tmp_path, "../etc")


def test_keys_cli_enroll_list_revoke(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = str(tmp_path / "enrolled")
    assert main(["keys", "create", "--host", "gpu-1", "--dir", str(tmp_path)]) == 0
    assert main(["keys", "create", "--host", "gpu-2", "--dir", str(tmp_path)]) == 0
    assert main(["keys", "create", "--server", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "server.key_secret").exists()
    k1 = str(tmp_path / "gpu-1.key")
    assert main(["keys", "enroll", "--host", "gpu-1", k1, "--store", store]) == 0
    # One key speaks for one host; a host's key is rotated only on purpose.
    assert main(["keys", "enroll", "--host", "gpu-9", k1, "--store", store]) == 2
    assert main(["keys", "enroll", "--host", "gpu-1", str(tmp_path / "gpu-2.key"),
                 "--store", store]) == 2
    assert "already enrolled for gpu-1" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["keys", "list", "--json", "--store", store]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["hosts"] == [{"host": "gpu-1",
                                "public_key": keys.load_public(k1).decode()}]
    assert main(["keys", "revoke", "--host", "gpu-1", "--store", store]) == 0
    assert main(["keys", "revoke", "--host", "gpu-1", "--store", store]) == 2
    assert keys.read_store(store) == {}


def test_enrolled_keys_follow_the_file_and_survive_a_broken_edit(tmp_path: Path) -> None:
    store = tmp_path / "enrolled"
    k1 = keys.load_public(keys.create_pair(tmp_path, "gpu-1")[0])
    k2 = keys.load_public(keys.create_pair(tmp_path, "gpu-2")[0])
    keys.enroll(store, "gpu-1", k1)
    live = EnrolledKeys(store)
    assert live.host_for(k1) == "gpu-1" and live.host_for(k2) is None
    keys.enroll(store, "gpu-2", k2)
    keys.revoke(store, "gpu-1")
    live.refresh()
    assert live.host_for(k1) is None and live.host_for(k2) == "gpu-2"
    store.write_text(store.read_text() + f"gpu-3 {k2.decode()}\n")  # a hand edit: key reused
    live.refresh()
    assert live.host_for(k2) == "gpu-2"  # the last good view, not everyone or no one
    with pytest.raises(KeyFileError, match="already enrolled for gpu-2"):
        EnrolledKeys(store)  # at start, a broken store is an error


def _zap_request(mechanism: bytes, creds: list[bytes]) -> list[bytes]:
    return [b"1.0", b"7", b"c4", b"127.0.0.1", b"", mechanism, *creds]


def test_zap_handler_admits_enrolled_keys_only(tmp_path: Path) -> None:
    store = tmp_path / "enrolled"
    pub = keys.load_public(keys.create_pair(tmp_path, "gpu-1")[0])
    keys.enroll(store, "gpu-1", pub)
    other = zmq.curve_keypair()[0]
    ctx = zmq.Context()
    try:
        zap = ZapHandler(ctx, EnrolledKeys(store))
        ok = zap.answer(_zap_request(b"CURVE", [zmq.utils.z85.decode(pub)]))
        assert ok[2] == b"200" and ok[4] == pub  # User-Id: the key, looked up per frame
        assert zap.answer(_zap_request(b"CURVE", [zmq.utils.z85.decode(other)]))[2] == b"400"
        assert zap.answer(_zap_request(b"NULL", []))[2] == b"400"
        assert zap.answer([b"2.0", b"x"])[2] == b"400"
        assert zap.stats()["denied"] == {"unenrolled": 1, "mechanism": 1, "bad_request": 1}
        zap.close()
    finally:
        ctx.destroy(0)


def test_a_curve_server_without_a_zap_handler_admits_no_one(tmp_path: Path) -> None:
    """ZeroMQ's default without a handler is to admit every key; ZAP_ENFORCE_DOMAIN turns that
    into refusing every key, so a handler that failed to start cannot open the door."""
    keys.create_pair(tmp_path, "server")
    keys.create_pair(tmp_path, "gpu-1")
    ctx = zmq.Context()
    try:
        server = ctx.socket(zmq.ROUTER)
        curve_server(server, *keys.load_secret(tmp_path / "server.key_secret"))
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = ctx.socket(zmq.DEALER)
        ClientKeys.load(tmp_path / "server.key", tmp_path / "gpu-1.key_secret").apply(client)
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send(b"hello")
        assert not server.poll(1500)
    finally:
        ctx.destroy(0)


def _frame(host: str, seq: int = 1) -> bytes:
    return msgpack.packb({"v": [1, 0], "kind": "report", "host": host, "boot": "b", "seq": seq,
                          "ts": 1.0, "body": {"interval": 1.0, "health": {}}})


def test_ingest_rejects_a_frame_for_another_host_than_its_key() -> None:
    ing = Ingest(Store(connect(":memory:")), HostRegistry(), None)
    out = ing.handle(_frame("victim"), 1.0, identity="gpu-2")
    assert out.reject == "identity" and out.replies[0].body["ref_seq"] == 1
    assert "enrolled for 'gpu-2'" in out.replies[0].body["reason"]
    assert ing.handle(_frame("victim", 2), 1.0, identity="").reject == "identity"
    assert ing.stats()["rejected"]["identity"] == 2 and "victim" not in ing.registry.hosts
    assert ing.handle(_frame("gpu-2"), 1.0, identity="gpu-2").reject is None
    assert ing.handle(_frame("anyone"), 1.0).reject is None  # replay, insecure: no binding


def _post(url: str, token: str | None = None) -> tuple[int, dict, str]:
    req = urllib.request.Request(url, data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read()), ""
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), exc.headers.get("WWW-Authenticate", "")


def test_state_changing_requests_need_the_bearer_token() -> None:
    api = Api(Ingest(Store(connect(":memory:", check_same_thread=False)), HostRegistry(), None),
              None, threading.Lock(), time.time)
    httpd = serve(api, "127.0.0.1:0")
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    url = base + "/api/v1/plan/apply"  # a state-changing route (this Api has no planner)
    try:
        code, body, _ = _post(url, "whatever-token-123")
        assert code == 403 and "api_token_file" in body["error"]  # no token configured: off
        api.token = "s3cret-token-of-32-characters-xx"
        code, _, challenge = _post(url)
        assert code == 401 and challenge.startswith("Bearer")
        assert _post(url, "s3cret-token-of-32-characters-xy")[0] == 401
        assert _post(url, api.token)[0] == 404  # past the check; no planner behind it
        assert _post(base + "/api/v1/hosts", api.token)[0] == 405  # a GET-only route
    finally:
        httpd.shutdown()
        httpd.server_close()
    with pytest.raises(Exception, match="wrong bearer"):
        require_token("Basic s3cret", "s3cret")
    require_token("bearer  s3cret", "s3cret")
