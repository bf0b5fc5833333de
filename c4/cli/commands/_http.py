"""Talking to the aggregator's HTTP JSON API from the CLI."""
from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any, Callable

DEFAULT_URL = "http://127.0.0.1:9464"


class ApiError(RuntimeError):
    pass


def add_aggregator_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--aggregator", metavar="URL",
                   default=os.environ.get("C4_AGGREGATOR", DEFAULT_URL),
                   help=f"aggregator API base URL (env C4_AGGREGATOR, default {DEFAULT_URL})")


def get_json(base_url: str, path: str, timeout: float = 10.0,
             post_token: str | None = None) -> dict[str, Any]:
    """GET `path`; with `post_token`, POST an empty JSON body with that bearer token."""
    url = base_url.rstrip("/") + path
    req = urllib.request.Request(url) if post_token is None else urllib.request.Request(
        url, data=b"{}", method="POST", headers={"Content-Type": "application/json",
                                                 "Authorization": f"Bearer {post_token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return body
    except urllib.error.HTTPError as exc:
        try:
            msg = json.loads(exc.read()).get("error", exc.reason)
        except ValueError:
            msg = exc.reason
        raise ApiError(f"{url}: {exc.code} {msg}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiError(f"cannot reach the aggregator at {base_url}: {reason} "
                       "(is `c4 aggregator run` running? set --aggregator or C4_AGGREGATOR)") from None
    except ValueError as exc:
        raise ApiError(f"{url}: the reply is not JSON: {exc}") from None


def query(args: argparse.Namespace, path: str, render: Callable[[dict[str, Any]], Any]) -> int:
    """GET `path` from the aggregator; print JSON with --json, else `render(data)` with rich."""
    try:
        data = get_json(args.aggregator, path)
    except ApiError as exc:
        return fail(str(exc))
    if args.json:
        print_json(data)
    else:
        from rich.console import Console

        Console().print(render(data))
    return 0


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, sort_keys=True, indent=2, default=str)
    sys.stdout.write("\n")


def fail(msg: str, code: int = 1) -> int:
    print(f"c4: {msg}", file=sys.stderr)
    return code
