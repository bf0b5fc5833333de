"""CURVE key files and the aggregator's enrolled-key store (docs/security.md, `c4 keys`).

Key pairs are ZeroMQ certificate files (the ZPL format `zmq.auth` reads): `NAME.key` holds the
public key, `NAME.key_secret` both keys and is created mode 0600. A secret file that others can
read, or that belongs to someone else, is refused, as ssh refuses such a private key.

The enrolled-key store is one text file, one `host public-key` per line; each key speaks for
exactly one host and each host has at most one key. Writers replace it atomically (rename), so
a reader that notices a new (inode, mtime, size) sees a whole file: that is how the aggregator
picks up enrolments and revocations without a restart.
"""
from __future__ import annotations

import fcntl
import logging
import os
import stat
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import zmq
from zmq.utils import z85

from .config import ConfigError
from .wire.kinds import HOST
from .wire.schema import Invalid

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
SERVER_NAME = "server"  # the aggregator's own pair: server.key, server.key_secret
STORE_HEADER = ("# c4 enrolled agent keys: one `host public-key` (Z85) per line.\n"
                "# Managed with `c4 keys enroll/revoke/list`; see docs/security.md.\n")


class KeyFileError(ConfigError):
    """A key file or the enrolled-key store is missing, malformed or unsafe."""


def check_host(name: str) -> str:
    try:
        return HOST.check(name)
    except Invalid as exc:
        raise KeyFileError(f"{name!r} is not a valid host name: {exc.reason}") from None


def _z85_key(text: str, where: str) -> bytes:
    """A Z85 CURVE key (40 characters, 32 bytes) as bytes, or KeyFileError."""
    raw = text.encode("ascii", "replace")
    try:
        ok = len(raw) == 40 and len(z85.decode(raw)) == 32
    except (ValueError, KeyError, IndexError):  # pyzmq's decoder raises these on bad input
        ok = False
    if not ok:
        raise KeyFileError(f"{where}: not a CURVE key (40 Z85 characters): {text[:60]!r}")
    return raw


def _read_cert(path: Path) -> dict[str, bytes]:
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise KeyFileError(f"{path}: no such key file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{path}: cannot read: {exc}") from None
    found: dict[str, bytes] = {}
    for line in text.splitlines():
        name, eq, value = line.strip().partition("=")
        if eq and name.strip() in ("public-key", "secret-key"):
            found[name.strip()] = _z85_key(value.strip().strip("'\""), str(path))
    if "public-key" not in found:
        raise KeyFileError(f"{path}: no public-key line (expected a ZeroMQ certificate)")
    return found


def load_public(path: str | Path) -> bytes:
    """The Z85 public key of a `.key` (or `.key_secret`) file."""
    return _read_cert(Path(path))["public-key"]


def load_secret(path: str | Path) -> tuple[bytes, bytes]:
    """(public, secret), Z85, from a `.key_secret` file that only its owner can read."""
    p = Path(path)
    if not p.exists():
        raise KeyFileError(f"{p}: no such secret key file")
    keys = _read_cert(p)
    secret = keys.get("secret-key")
    if secret is None:
        raise KeyFileError(f"{p}: no secret-key line (is this the public `.key` file?)")
    st = p.stat()
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{p}: secret key is accessible to others (mode "
                           f"{stat.S_IMODE(st.st_mode):04o}); run `chmod 600 {p}`")
    if st.st_uid not in (os.geteuid(), 0):
        raise KeyFileError(f"{p}: secret key belongs to uid {st.st_uid}, not to this user "
                           f"(uid {os.geteuid()}) or root")
    if zmq.curve_public(secret) != keys["public-key"]:
        raise KeyFileError(f"{p}: public-key does not belong to secret-key")
    return keys["public-key"], secret


def _cert_text(kind: str, name: str, public: bytes, secret: bytes | None) -> str:
    lines = [f"#   ZeroMQ CURVE {kind} certificate for {name}, written by `c4 keys create`",
             "#   (ZPL format, readable by zmq.auth.load_certificate)"]
    if secret is not None:
        lines.append("#   SECRET: keep this file mode 0600 and never copy it off this host.")
    lines += ["", "metadata", f'    name = "{name}"', "curve",
              f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int, force: bool) -> None:
    """Create `path` with `mode` from the start (no window in which others can read it)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise KeyFileError(f"{path}: exists; pass --force to replace it") from None
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), mode)  # O_CREAT's mode is masked by umask; an old file keeps its own
        f.write(text)


def create_pair(directory: str | Path, name: str, *, force: bool = False) -> tuple[Path, Path]:
    """Write NAME.key (0644) and NAME.key_secret (0600) in `directory`; returns both paths."""
    check_host(name)
    d = Path(directory)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    pub_path, sec_path = d / f"{name}{PUBLIC_SUFFIX}", d / f"{name}{SECRET_SUFFIX}"
    if not force:
        for p in (pub_path, sec_path):
            if p.exists():
                raise KeyFileError(f"{p}: exists; pass --force to replace it")
    _write_new(sec_path, _cert_text("secret", name, public, secret), 0o600, force)
    _write_new(pub_path, _cert_text("public", name, public, None), 0o644, force)
    return pub_path, sec_path


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client (an agent) needs: the server's public key and its own pair (Z85)."""

    server_public: bytes
    public: bytes
    secret: bytes

    @classmethod
    def load(cls, server_public: str | Path, secret: str | Path) -> "ClientKeys":
        return cls(load_public(server_public), *load_secret(secret))

    def apply(self, sock: zmq.Socket[Any]) -> None:
        """Make `sock` a CURVE client of the server; call before connect()."""
        sock.curve_serverkey = self.server_public
        sock.curve_publickey = self.public
        sock.curve_secretkey = self.secret


# -- the enrolled-key store ----------------------------------------------------------------

def parse_store(text: str, where: str) -> dict[str, bytes]:
    """host -> Z85 public key; a key listed for two hosts or a host listed twice is an error."""
    hosts: dict[str, bytes] = {}
    owners: dict[bytes, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise KeyFileError(f"{where}:{n}: expected `host public-key`")
        host, key = check_host(parts[0]), _z85_key(parts[1], f"{where}:{n}")
        if host in hosts:
            raise KeyFileError(f"{where}:{n}: host {host} is listed twice")
        if key in owners:
            raise KeyFileError(f"{where}:{n}: this key is already enrolled for {owners[key]}")
        hosts[host], owners[key] = key, host
    return hosts


def read_store(path: str | Path) -> dict[str, bytes]:
    p = Path(path)
    try:
        return parse_store(p.read_text(encoding="ascii"), str(p))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"{p}: cannot read: {exc}") from None


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise read-modify-write of the store between concurrent `c4 keys` runs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write_store(path: Path, hosts: dict[str, bytes]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    body = "".join(f"{h} {k.decode()}\n" for h, k in sorted(hosts.items()))
    with open(tmp, "w", encoding="ascii") as f:
        os.fchmod(f.fileno(), 0o644)  # public keys; what matters is who may write the directory
        f.write(STORE_HEADER + body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def enroll(store: str | Path, host: str, key: bytes, *, replace: bool = False) -> str:
    """Bind `key` to `host` in the store; returns what changed ("added", "replaced",
    "unchanged"). A key already bound to another host is refused: one key speaks for one host."""
    p = Path(store)
    check_host(host)
    with _locked(p):
        hosts = read_store(p)
        for other, k in hosts.items():
            if k == key and other != host:
                raise KeyFileError(f"this key is already enrolled for {other}; one key "
                                   f"speaks for one host (`c4 keys revoke --host {other}` first)")
        old = hosts.get(host)
        if old == key:
            return "unchanged"
        if old is not None and not replace:
            raise KeyFileError(f"{host} already has a different key enrolled; pass --replace "
                               f"to rotate it")
        hosts[host] = key
        _write_store(p, hosts)
    return "replaced" if old is not None else "added"


def revoke(store: str | Path, host: str) -> bytes:
    """Remove `host`'s key from the store; returns the key."""
    p = Path(store)
    with _locked(p):
        hosts = read_store(p)
        if host not in hosts:
            raise KeyFileError(f"{host} has no enrolled key in {p}")
        key = hosts.pop(host)
        _write_store(p, hosts)
    return key


@dataclass(frozen=True)
class _Snapshot:
    stamp: tuple[int, int, int] | None  # (inode, mtime_ns, size); None: no file
    by_key: dict[bytes, str]


class EnrolledKeys:
    """The aggregator's live view of the store: re-read whenever the file changes.

    `refresh()` costs one stat(); the ZAP handler calls it on every handshake and the ingest
    loop before every batch, so `c4 keys revoke` takes effect within one batch, no restart or
    signal needed. A store that became unreadable or malformed keeps the last good view (and
    says so once per change) rather than locking every agent out or letting everyone in.
    """

    def __init__(self, path: str | Path, log: logging.Logger | None = None) -> None:
        self.path = Path(path)
        self.log = log or logging.getLogger("c4.keys")
        self._lock = threading.Lock()
        self._snap = _Snapshot(None, {})
        self._bad_stamp: tuple[int, int, int] | None = None
        self.refresh(strict=True)

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def refresh(self, strict: bool = False) -> None:
        stamp = self._stamp()
        if stamp == self._snap.stamp or (stamp is not None and stamp == self._bad_stamp):
            return
        with self._lock:
            if stamp == self._snap.stamp:
                return
            try:
                hosts = read_store(self.path)
            except KeyFileError as exc:
                if strict:
                    raise
                self._bad_stamp = stamp
                self.log.error("enrolled keys: %s; keeping the previous %d key(s)", exc,
                               len(self._snap.by_key))
                return
            self._snap = _Snapshot(stamp, {k: h for h, k in hosts.items()})
            self.log.info("enrolled keys: %d host(s) from %s", len(hosts), self.path)

    def host_for(self, key: bytes) -> str | None:
        """The host `key` (Z85) is enrolled for, or None."""
        return self._snap.by_key.get(key)

    def __len__(self) -> int:
        return len(self._snap.by_key)
