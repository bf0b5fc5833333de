"""`c4 keys`: CURVE key pairs for agents and the aggregator, and the enrolled-key store."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

from c4.core import keys

from ._http import fail

DEFAULT_DIR = "/etc/c4/keys"
DEFAULT_STORE = f"{DEFAULT_DIR}/enrolled"


def register(sub: argparse._SubParsersAction[Any]) -> None:
    p = sub.add_parser("keys", help="create, enroll, list and revoke CURVE keys",
                       description="Agent identity (docs/security.md): each agent has a CURVE "
                       "key pair; the aggregator admits only keys enrolled in its store, each "
                       "bound to one host name. Enrolment and revocation take effect without "
                       "restarting the aggregator.")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION")
    ksub.required = True

    c = ksub.add_parser("create", help="write a new key pair",
                        description="Write NAME.key (public) and NAME.key_secret (secret, mode "
                        "0600, owned by you) into DIR. --server writes the aggregator's pair "
                        "(server.key, server.key_secret).")
    who = c.add_mutually_exclusive_group(required=True)
    who.add_argument("--host", metavar="NAME", help="the agent host the pair is for")
    who.add_argument("--server", action="store_true", help="the aggregator's own pair")
    c.add_argument("--dir", default=DEFAULT_DIR, metavar="D",
                   help=f"directory to write to (default {DEFAULT_DIR}; created mode 0700)")
    c.add_argument("--force", action="store_true", help="replace existing files")
    c.set_defaults(func=_create)

    e = ksub.add_parser("enroll", help="let a host's public key connect",
                        description="Bind the public key in PUBFILE (a NAME.key file) to host "
                        "NAME in the aggregator's store. A key speaks for one host only.")
    e.add_argument("--host", required=True, metavar="NAME", help="host name the agent reports")
    e.add_argument("pubfile", metavar="PUBFILE", help="the agent's public key file (NAME.key)")
    e.add_argument("--replace", action="store_true",
                   help="rotate: replace a different key already enrolled for NAME")
    _store_arg(e)
    e.set_defaults(func=_enroll)

    ls = ksub.add_parser("list", help="list enrolled hosts and keys",
                         description="List the hosts enrolled in the store with their keys.")
    ls.add_argument("--json", action="store_true", help="print JSON for scripts")
    _store_arg(ls)
    ls.set_defaults(func=_list)

    r = ksub.add_parser("revoke", help="remove a host's key",
                        description="Remove NAME's key from the store: new connections with it "
                        "are refused and frames on connections it already has are rejected "
                        "(reason `identity`), without restarting the aggregator.")
    r.add_argument("--host", required=True, metavar="NAME", help="the host to revoke")
    _store_arg(r)
    r.set_defaults(func=_revoke)


def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=DEFAULT_STORE, metavar="FILE",
                   help=f"the aggregator's enrolled-key store, its `enrolled_keys` "
                   f"(default {DEFAULT_STORE})")


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Key and store problems (and unwritable directories) are one clear line, exit 2."""
    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except keys.KeyFileError as exc:
            return fail(str(exc), 2)
        except OSError as exc:
            return fail(f"{exc.filename or ''}: {exc.strerror or exc}", 2)
    return run


@_guard
def _create(args: argparse.Namespace) -> int:
    name = keys.SERVER_NAME if args.server else args.host
    pub, sec = keys.create_pair(args.dir, name, force=args.force)
    print(f"public key: {pub}\nsecret key: {sec} (mode 0600)")
    if args.server:
        print(f"aggregator.toml: server_secret_key = \"{sec}\"; copy {pub} to every agent "
              f"(agent.toml: server_public_key)")
    else:
        print(f"agent.toml: secret_key = \"{sec}\"; on the aggregator: "
              f"c4 keys enroll --host {name} {pub.name}")
    return 0


@_guard
def _enroll(args: argparse.Namespace) -> int:
    key = keys.load_public(args.pubfile)
    what = keys.enroll(args.store, args.host, key, replace=args.replace)
    print(f"{args.host}: {what} ({key.decode()}) in {args.store}")
    return 0


@_guard
def _list(args: argparse.Namespace) -> int:
    hosts = keys.read_store(args.store)
    if args.json:
        print(json.dumps({"store": str(Path(args.store)), "hosts": [
            {"host": h, "public_key": k.decode()} for h, k in sorted(hosts.items())]}))
        return 0
    for h, k in sorted(hosts.items()):
        print(f"{h}  {k.decode()}")
    if not hosts:
        print(f"no keys enrolled in {args.store}")
    return 0


@_guard
def _revoke(args: argparse.Namespace) -> int:
    key = keys.revoke(args.store, args.host)
    print(f"{args.host}: revoked ({key.decode()}) from {args.store}")
    return 0
