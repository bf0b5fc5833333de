"""C4D actions: turn an incident into alert / drain / restart actions, behind guard rails.

A policy of rules maps incident classes and a minimum suspect confidence to actions. Guard
rails, because a false isolation costs a whole job:
- dry-run by default: log and record what would run, execute nothing;
- at most `max_drains` drains per `window_s` (dry-run drains count, so a dry run shows the
  real policy); further drains are recorded as "skipped: rate limit"; restarts likewise, per
  job, with `max_restarts`;
- never touch a node a human drained (Slurm: checked with `scontrol show node` right before
  draining); c4 never undrains; never a target Slurm would expand to other nodes (`ALL`,
  host lists, node sets);
- placeholder values that could be read as options or break a command line (leading `-`,
  control characters) are refused and recorded, never passed on;
- never act twice on the same (incident, action, target): a UNIQUE key in the `actions` table;
- every action is recorded with its outcome, exit code, stderr tail and duration.

Threads (the one lock story of the aggregator, see server.py): commands can take up to
`timeout_s` each, so the live aggregator runs them in an ActionWorker, a thread with its own
SQLite connection fed by a bounded queue; the diagnosis tick submits incidents and collects
the records on a later tick. Nothing here holds the aggregator's lock. Replay and tests use
ActionRunner inline (same interface: submit, then results), which keeps replay deterministic.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from c4.core.catalog import DRAINABLE_KINDS, INCIDENT_CLASSES
from c4.core.config import ConfigError, field

from .schema import migrate

CLASSES = tuple(INCIDENT_CLASSES)
ACTIONS = ("alert", "drain", "restart")
DRAIN_BACKENDS = ("slurm", "kubernetes", "exec")
RESTART_BACKENDS = ("none", "exec", "webhook")
PLACEHOLDERS = ("host", "class", "incident", "job")
# Outcomes that acted (or, in dry-run, would have acted); a timeout may have.
_ACTED = ("ok", "dry-run", "timeout")
_STDERR_TAIL = 512
_PLACEHOLDER_RE = re.compile(r"\{([^{}]*)\}")
# What a host or job name may be when it reaches a command line: no leading dash (an
# option), no whitespace or control characters, no Slurm host-list syntax (`[`, `,`).
_SAFE_VALUE_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=/-]{0,254}")
# Names that Slurm expands to more than one node when given as NodeName.
_SLURM_RESERVED = frozenset({"all"})


@dataclass(frozen=True)
class Rule:
    classes: list[str] = field([], 'incident classes this rule applies to; "*" matches every class')
    min_confidence: float = field(
        0.0, "the rule fires when the top suspect's confidence is at least this (0..1); "
        "`drain` only targets suspects at least this confident")
    actions: list[str] = field([], "what to do, in order: `alert`, `drain`, `restart`")

    def validate(self, where: str) -> None:
        if not self.classes:
            raise ConfigError(f"{where}.classes: list at least one class (or \"*\")")
        for c in self.classes:
            if c != "*" and c not in CLASSES:
                raise ConfigError(f"{where}.classes: unknown class {c!r}; known: *, {', '.join(CLASSES)}")
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ConfigError(f"{where}.min_confidence: must be within 0..1, got {self.min_confidence}")
        if not self.actions:
            raise ConfigError(f"{where}.actions: list at least one action ({', '.join(ACTIONS)})")
        for a in self.actions:
            if a not in ACTIONS:
                raise ConfigError(f"{where}.actions: unknown action {a!r}; known: {', '.join(ACTIONS)}")

    def __repr__(self) -> str:
        # TOML inline-table syntax: the generated docs/config.md shows the default policy as
        # it would be written in aggregator.toml.
        return (f"{{classes = {json.dumps(self.classes)}, min_confidence = {self.min_confidence}, "
                f"actions = {json.dumps(self.actions)}}}")

    def matches(self, cls: str, confidence: float) -> bool:
        return ("*" in self.classes or cls in self.classes) and confidence >= self.min_confidence


DEFAULT_RULES = [
    Rule(classes=["*"], min_confidence=0.0, actions=["alert"]),
    Rule(classes=["hw_xid", "hw_nic_down", "hw_aer", "comm_hang", "noncomm_hang", "comm_slow",
                  "noncomm_slow"], min_confidence=0.9, actions=["drain"]),
]


@dataclass
class ActionsConfig:
    dry_run: bool = field(True, "log and record what would be done, execute nothing (alerts are still logged)")
    rules: list[Rule] = field(DEFAULT_RULES, "the policy: `[[actions.rules]]` tables with `classes`, `min_confidence` and `actions` (docs/actions.md); every matching rule applies")
    drain_backend: str = field("slurm", "how to drain a node: `slurm` (scontrol), `kubernetes` (kubectl cordon + taint) or `exec` (drain_command)")
    scontrol: str = field("scontrol", "the scontrol binary: a name looked up on PATH or a path")
    kubectl: str = field("kubectl", "the kubectl binary: a name looked up on PATH or a path")
    drain_command: list[str] = field([], "argv of the drain hook for drain_backend = \"exec\"; placeholders {host} {class} {incident} {job}")
    restart_backend: str = field("none", "how to request a job restart: `none`, `exec` (restart_command) or `webhook` (POST JSON to restart_url)")
    restart_command: list[str] = field([], "argv of the restart hook for restart_backend = \"exec\"; placeholders {host} {class} {incident} {job}")
    restart_url: str = field("", "URL that receives the restart request (HTTP POST, JSON) for restart_backend = \"webhook\"")
    max_drains: int = field(2, "at most this many nodes drained per window_s; further drains are skipped and recorded")
    max_restarts: int = field(1, "at most this many restart requests per job per window_s; further ones are skipped and recorded")
    window_s: float = field(3600.0, "the drain rate-limit window, seconds")
    timeout_s: float = field(10.0, "time limit of each command or webhook call, seconds")

    def validate(self, where: str) -> None:
        w = f"{where}." if where else ""
        if self.drain_backend not in DRAIN_BACKENDS:
            raise ConfigError(f"{w}drain_backend: {self.drain_backend!r} is not one of {', '.join(DRAIN_BACKENDS)}")
        if self.restart_backend not in RESTART_BACKENDS:
            raise ConfigError(f"{w}restart_backend: {self.restart_backend!r} is not one of {', '.join(RESTART_BACKENDS)}")
        for key in ("max_drains", "max_restarts"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{w}{key}: must be >= 0, got {getattr(self, key)}")
        for key in ("window_s", "timeout_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{w}{key}: must be > 0, got {getattr(self, key)}")
        if self.drain_backend == "exec":
            _check_hook(f"{w}drain_command", self.drain_command)
        if self.restart_backend == "exec":
            _check_hook(f"{w}restart_command", self.restart_command)
        if self.restart_backend == "webhook" and not self.restart_url.startswith(("http://", "https://")):
            raise ConfigError(f"{w}restart_url: restart_backend = \"webhook\" needs an http:// or https:// URL, got {self.restart_url!r}")
        if self.restart_backend == "none":
            for i, r in enumerate(self.rules):
                if "restart" in r.actions:
                    raise ConfigError(f"{w}rules[{i}].actions: `restart` needs {w}restart_backend = \"exec\" or \"webhook\"")


def _check_hook(where: str, argv: list[str]) -> None:
    if not argv:
        raise ConfigError(f"{where}: give the hook's argv, e.g. [\"/usr/local/bin/hook\", \"{{host}}\"]")
    for arg in argv:
        for name in _PLACEHOLDER_RE.findall(arg):
            if name not in PLACEHOLDERS:
                raise ConfigError(f"{where}: unknown placeholder {{{name}}}; known: "
                                  + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))


@dataclass(frozen=True)
class _Incident:
    """The fields of an incident dict that actions use, validated."""

    id: int
    cls: str
    state: str
    job: str | None
    summary: str
    suspects: list[dict[str, Any]]  # sorted by confidence, highest first

    @classmethod
    def parse(cls, d: Any) -> "_Incident":
        if not isinstance(d, dict):
            raise ValueError(f"expected an incident object, got {type(d).__name__}")
        iid = d.get("id")
        if isinstance(iid, bool) or not isinstance(iid, int):
            raise ValueError(f"id: expected an integer, got {iid!r}")
        for key in ("class", "state"):
            if not isinstance(d.get(key), str):
                raise ValueError(f"{key}: expected a string, got {d.get(key)!r}")
        job = d.get("job")
        if job is not None and not isinstance(job, str):
            raise ValueError(f"job: expected a string or null, got {job!r}")
        suspects = d.get("suspects") or []
        if not isinstance(suspects, list):
            raise ValueError("suspects: expected a list")
        for i, s in enumerate(suspects):
            conf = s.get("confidence") if isinstance(s, dict) else None
            if isinstance(conf, bool) or not isinstance(conf, (int, float)):
                raise ValueError(f"suspects[{i}].confidence: expected a number, got {conf!r}")
        ranked = sorted(suspects, key=lambda s: -s["confidence"])
        return cls(iid, d["class"], d["state"], job, str(d.get("summary", "")), ranked)

    @property
    def confidence(self) -> float:
        return self.suspects[0]["confidence"] if self.suspects else 0.0

    def drain_hosts(self, min_confidence: float) -> list[str]:
        hosts: list[str] = []
        for s in self.suspects:
            host = s.get("host")
            if (s.get("kind") in DRAINABLE_KINDS and isinstance(host, str) and host
                    and s["confidence"] >= min_confidence and host not in hosts):
                hosts.append(host)
        return hosts


@dataclass
class _Result:
    outcome: str
    detail: str = ""
    exit_code: int | None = None
    stderr: str = ""
    stdout: str = ""  # read by the Slurm guard, not recorded


_COLUMNS = ("id", "incident", "action", "target", "backend", "command", "dry_run", "outcome",
            "detail", "exit_code", "stderr", "duration_s", "ts")


class ActionRunner:
    """Applies the policy to incidents; see the module docstring and docs/actions.md."""

    def __init__(self, cfg: ActionsConfig, db: sqlite3.Connection, log: logging.Logger,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.db = db
        self.log = log
        self.clock = clock
        self.rejected = 0  # incidents refused as malformed
        self._done: deque[tuple[int, list[dict[str, Any]]]] = deque()
        migrate(self.db)

    def submit(self, incident: dict[str, Any], now: float) -> None:
        """Inline: act now; the records come back from the next results()."""
        iid = incident.get("id") if isinstance(incident, dict) else None
        try:
            records = self.on_incident(incident, now)
        except Exception:  # a backend bug must not stop diagnosis
            self.log.exception("actions: runner failed on incident %r", iid)
            return
        if isinstance(iid, int) and records:
            self._done.append((iid, records))

    def results(self) -> list[tuple[int, list[dict[str, Any]]]]:
        """(incident id, records made) for each incident acted on since the last call."""
        out = list(self._done)
        self._done.clear()
        return out

    def on_incident(self, incident: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """Apply the policy to a new or updated incident; returns the records made this call."""
        try:
            inc = _Incident.parse(incident)
        except ValueError as exc:
            self.rejected += 1
            iid = incident.get("id") if isinstance(incident, dict) else None
            self.log.error("actions: rejected incident %r: %s", iid, exc)
            return []
        if inc.state != "open":
            return []
        made = []
        for rule in self.cfg.rules:
            if not rule.matches(inc.cls, inc.confidence):
                continue
            for action in rule.actions:
                for target in self._targets(action, inc, rule):
                    rec = self._act(action, target, inc, now)
                    if rec is not None:
                        made.append(rec)
        return made

    def records(self, incident: int | None = None) -> list[dict[str, Any]]:
        """Stored action records, oldest first (all, or one incident's)."""
        sql = f"SELECT {', '.join(_COLUMNS)} FROM actions"
        rows = (self.db.execute(sql + " WHERE incident = ? ORDER BY id", (incident,)) if incident is not None
                else self.db.execute(sql + " ORDER BY id"))
        return [_row_dict(r) for r in rows]

    # -- policy -------------------------------------------------------------------------------

    def _targets(self, action: str, inc: _Incident, rule: Rule) -> list[str]:
        if action == "drain":
            return inc.drain_hosts(rule.min_confidence)
        if action == "restart":
            return [inc.job or ""]
        return [""]

    def _act(self, action: str, target: str, inc: _Incident, now: float) -> dict[str, Any] | None:
        if self.db.execute("SELECT 1 FROM actions WHERE incident = ? AND action = ? AND target = ?",
                           (inc.id, action, target)).fetchone():
            return None
        backend, steps = self._plan(action, target, inc)
        command = f"POST {steps[0]}" if backend == "webhook" else " && ".join(shlex.join(s) for s in steps)
        t0 = self.clock()
        if action == "drain" and (n := self._drains_since(now - self.cfg.window_s)) >= self.cfg.max_drains:
            res = _Result("skipped: rate limit",
                          f"{n} drain(s) in the last {self.cfg.window_s:g} s (max_drains = {self.cfg.max_drains})")
        elif action == "restart" and not target:
            res = _Result("skipped: no job", "the incident names no job to restart")
        elif action == "restart" and (n := self._restarts_since(target, now - self.cfg.window_s)) >= self.cfg.max_restarts:
            res = _Result("skipped: rate limit",
                          f"{n} restart(s) of job {target} in the last {self.cfg.window_s:g} s "
                          f"(max_restarts = {self.cfg.max_restarts})")
        elif action != "alert" and (why := self._unsafe(action, target, inc)) is not None:
            res = _Result("refused: unsafe target", why)
        elif action == "alert":
            res = self._alert(inc)
        elif self.cfg.dry_run:
            res = _Result("dry-run", f"would run: {command}")
        elif backend == "webhook":
            res = self._post(steps[0], inc)
        else:
            res = self._run_steps(action, backend, target, steps)
        rec = {
            "incident": inc.id, "action": action, "target": target, "backend": backend,
            "command": command, "dry_run": self.cfg.dry_run, "outcome": res.outcome,
            "detail": res.detail, "exit_code": res.exit_code, "stderr": res.stderr[-_STDERR_TAIL:],
            "duration_s": max(0.0, self.clock() - t0), "ts": now,
        }
        with self.db:
            cur = self.db.execute(
                f"INSERT INTO actions ({', '.join(_COLUMNS[1:])}) VALUES ({', '.join('?' * (len(_COLUMNS) - 1))})",
                tuple(int(v) if isinstance(v, bool) else v for v in (rec[c] for c in _COLUMNS[1:])))
        rec["id"] = cur.lastrowid
        level = logging.ERROR if res.outcome in ("failed", "timeout", "error") else logging.WARNING
        self.log.log(level, "actions: incident %d (%s) %s %s [%s]: %s%s", inc.id, inc.cls, action,
                     target or "-", backend, res.outcome, f" ({res.detail})" if res.detail else "")
        return rec

    def _restarts_since(self, job: str, since: float) -> int:
        marks = ", ".join("?" * len(_ACTED))
        (n,) = self.db.execute(
            f"SELECT COUNT(*) FROM actions WHERE action = 'restart' AND target = ? AND ts > ? "
            f"AND outcome IN ({marks})", (job, since, *_ACTED)).fetchone()
        return int(n)

    def _unsafe(self, action: str, target: str, inc: _Incident) -> str | None:
        """Why a value headed for a command line must not go there, or None."""
        values = {"host": target if action == "drain" else (inc.drain_hosts(0.0) or [""])[0],
                  "job": inc.job or ""}
        for name, v in values.items():
            if v and not _SAFE_VALUE_RE.fullmatch(v):
                return f"{name} {v[:64]!r} is not a plain name (leading '-', spaces, control or host-list characters)"
        if action == "drain" and self.cfg.drain_backend == "slurm" and target.lower() in _SLURM_RESERVED:
            return f"host {target!r} is a Slurm reserved name that selects every node"
        return None

    def _drains_since(self, since: float) -> int:
        marks = ", ".join("?" * len(_ACTED))
        (n,) = self.db.execute(
            f"SELECT COUNT(*) FROM actions WHERE action = 'drain' AND ts > ? AND outcome IN ({marks})",
            (since, *_ACTED)).fetchone()
        return int(n)

    def _plan(self, action: str, target: str, inc: _Incident) -> tuple[str, list[Any]]:
        """(backend, steps): argv lists to run in order, or one URL for the webhook."""
        if action == "alert":
            return "log", []
        values = {"host": target if action == "drain" else (inc.drain_hosts(0.0) or [""])[0],
                  "class": inc.cls, "incident": str(inc.id), "job": inc.job or ""}
        if action == "drain":
            b = self.cfg.drain_backend
            if b == "slurm":
                return b, [[self.cfg.scontrol, "update", f"NodeName={target}", "State=DRAIN",
                            f"Reason=c4:{inc.cls}:{inc.id}"]]
            if b == "kubernetes":
                return b, [[self.cfg.kubectl, "cordon", target],
                           [self.cfg.kubectl, "taint", "nodes", target, f"c4.io/fault={inc.cls}:NoSchedule", "--overwrite"]]
            return b, [_fill(self.cfg.drain_command, values)]
        b = self.cfg.restart_backend
        if b == "webhook":
            return b, [self.cfg.restart_url]
        return b, [_fill(self.cfg.restart_command, values)]

    # -- doing --------------------------------------------------------------------------------

    def _alert(self, inc: _Incident) -> _Result:
        top = ", ".join(f"{s.get('kind')} {s.get('id')} ({s['confidence']:.0%})" for s in inc.suspects[:3])
        self.log.warning("c4 incident %d %s%s: %s; suspects: %s", inc.id, inc.cls,
                         f" job {inc.job}" if inc.job else "", inc.summary, top or "none")
        return _Result("ok", "logged")

    def _run_steps(self, action: str, backend: str, target: str, steps: list[list[str]]) -> _Result:
        if action == "drain" and backend == "slurm":
            guard = self._human_drain_guard(target)
            if guard is not None:
                return guard
        res = _Result("ok")
        for argv in steps:
            res = self._run(argv)
            if res.outcome != "ok":
                break
        return res

    def _human_drain_guard(self, host: str) -> _Result | None:
        """A result that stops the drain (human drain, or state unknown), or None to go on."""
        show = self._run([self.cfg.scontrol, "show", "node", host])
        if show.outcome != "ok":
            show.detail = f"cannot check the node's state, not draining: {show.detail}"
            return show
        if len(re.findall(r"^NodeName=", show.stdout, re.M)) > 1:
            return _Result("refused: unsafe target",
                           f"`scontrol show node {host}` lists several nodes (a node set?)")
        state, reason = parse_node_state(show.stdout)
        flags = {f.rstrip("*") for f in state.split("+")}
        if any(f.startswith(("DRAIN", "DOWN", "FAIL")) for f in flags) and not reason.startswith("c4:"):
            return _Result("skipped: drained by a human", f"State={state} Reason={reason}")
        return None

    def _run(self, argv: Sequence[str]) -> _Result:
        """Run argv (no shell) with the timeout."""
        exe = shutil.which(argv[0])
        if exe is None:
            return _Result("error", f"{argv[0]} not found on PATH")
        try:
            proc = subprocess.Popen([exe, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            return _Result("error", f"cannot run {exe}: {exc}")
        try:
            out, err = proc.communicate(timeout=self.cfg.timeout_s)
        except subprocess.TimeoutExpired:
            # The whole group: a hook's children must not outlive it holding our pipes.
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            return _Result("timeout", f"killed after {self.cfg.timeout_s:g} s", None, _text(err))
        if proc.returncode != 0:
            return _Result("failed", f"{os.path.basename(exe)} exited with {proc.returncode}",
                           proc.returncode, _text(err))
        return _Result("ok", "", 0, _text(err), _text(out))

    def _post(self, url: str, inc: _Incident) -> _Result:
        drained = [r["target"] for r in self.records(inc.id) if r["action"] == "drain" and r["outcome"] == "ok"]
        body = json.dumps({
            "source": "c4", "incident": inc.id, "class": inc.cls, "job": inc.job,
            "summary": inc.summary, "suspects": inc.suspects, "exclude_hosts": drained,
        }).encode()
        req = urllib.request.Request(url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
                return _Result("ok", f"HTTP {resp.status}")
        except urllib.error.HTTPError as exc:
            return _Result("failed", f"HTTP {exc.code} {exc.reason}", None, _text(exc.read()))
        except TimeoutError:
            return _Result("timeout", f"no answer within {self.cfg.timeout_s:g} s")
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                return _Result("timeout", f"no answer within {self.cfg.timeout_s:g} s")
            return _Result("error", f"cannot reach {url}: {reason}")


class ActionWorker:
    """An ActionRunner on its own thread, with its own SQLite connection (WAL lets it write
    beside ingest), fed by a bounded queue: submit never blocks (a full queue drops the
    incident, counted in `dropped`, and it is submitted again when its suspects change), and
    results() hands back what finished, for the diagnosis tick to attach to the incident."""

    def __init__(self, cfg: ActionsConfig, db_path: str, log: logging.Logger,
                 clock: Callable[[], float] = time.time, maxsize: int = 256) -> None:
        self.log = log
        self.dropped = 0
        self._q: queue.Queue[tuple[dict[str, Any], float] | None] = queue.Queue(maxsize)
        self._done: deque[tuple[int, list[dict[str, Any]]]] = deque()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, args=(cfg, db_path, clock),
                                         name="c4-actions", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _loop(self, cfg: ActionsConfig, db_path: str, clock: Callable[[], float]) -> None:
        from .store import connect

        try:
            runner = ActionRunner(cfg, connect(db_path), self.log, clock)
        except BaseException as exc:  # reported by __init__ in the caller's thread
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        while (item := self._q.get()) is not None:
            runner.submit(*item)
            self._done.extend(runner.results())  # deque.extend is atomic: no lock needed
        runner.db.close()

    @property
    def pending(self) -> int:
        return self._q.qsize()

    def submit(self, incident: dict[str, Any], now: float) -> None:
        try:
            self._q.put_nowait((incident, now))
        except queue.Full:
            self.dropped += 1
            self.log.error("actions: queue full (%d waiting), incident %r not acted on now",
                           self._q.maxsize, incident.get("id"))

    def results(self) -> list[tuple[int, list[dict[str, Any]]]]:
        out = []
        while self._done:
            out.append(self._done.popleft())
        return out

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the action in progress (bounded by its own timeout_s)."""
        try:
            self._q.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)


def parse_node_state(text: str) -> tuple[str, str]:
    """(State, Reason) from `scontrol show node` output; Reason runs to the end of its line."""
    state = re.search(r"\bState=(\S+)", text)
    reason = re.search(r"\bReason=(.*)$", text, re.M)
    return (state.group(1) if state else "", reason.group(1).strip() if reason else "")


def _fill(argv: list[str], values: dict[str, str]) -> list[str]:
    # Substitution by name only (not str.format): an incident field cannot reach attributes.
    return [_PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), a) for a in argv]


def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def _row_dict(row: Sequence[Any]) -> dict[str, Any]:
    d = dict(zip(_COLUMNS, row))
    d["dry_run"] = bool(d["dry_run"])
    return d
