"""Ingest: one frame in -> validated, deduplicated, stored, applied to host state, handed to
diagnosis. Transport-agnostic: the ZeroMQ server (server.py) and replay (replay.py) both feed
raw frames through `handle`, so a replay reproduces exactly what live ingest did.
"""
from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from c4.core import wire
from c4.core.wire import Frame, Invalid, Rejected, fast, kinds
from c4.core.wire.names import IDENT
from c4.core.wire.schema import SEQ

from .state import HostRegistry, HostState, SeqState
from .store import Store

if TYPE_CHECKING:  # federation imports nothing of ingest; only the type is needed here
    from .federation import Federation

BOOTS_KEPT = 4  # sequence states kept per host (agent restarts)
# Frame bytes pruned past retention_bytes in steps of this fraction (a delete per step, not
# per batch).
PRUNE_SLACK = 0.01


class DiagnosisSink(Protocol):
    def observe(self, frame: Frame, now: float) -> None: ...
    def tick(self, now: float) -> None: ...
    def host_silent(self, host: str, last_seen: float, now: float) -> None: ...
    def host_back(self, host: str, now: float) -> None: ...


@dataclass
class Outcome:
    frame: Frame | None = None
    reject: str | None = None
    duplicate: bool = False
    replies: list[Frame] = field(default_factory=list)


class Ingest:
    def __init__(self, store: Store, registry: HostRegistry, diagnosis: DiagnosisSink | None,
                 *, name: str = "aggregator", max_frame: int = wire.DEFAULT_MAX_FRAME,
                 silent_after: float = 0.0, retention_s: float = 3600.0,
                 retention_bytes: int = 1 << 30,
                 max_hosts: int = 20000, host_expiry_s: float = 7 * 86400.0,
                 log: logging.Logger | None = None) -> None:
        self.store = store
        self.registry = registry
        self.diagnosis = diagnosis
        self.name = name
        self.max_frame = max_frame
        self.silent_after = silent_after
        self.retention_s = retention_s
        self.retention_bytes = retention_bytes
        self.max_hosts = max_hosts
        self.host_expiry_s = host_expiry_s
        self.log = log or logging.getLogger("c4.aggregator.ingest")
        self.boot = uuid.uuid4().hex[:16]
        self._seq = 0
        self.accepted: Counter[str] = Counter()
        self.rejected: Counter[str] = Counter()
        self.duplicates = 0
        self.store_errors = 0
        # Failures of our own code, by where they happened: each costs one frame or one tick,
        # never the process (logged with a traceback the first time, then rate-limited).
        self.errors: Counter[str] = Counter()
        self.pending_acks: dict[str, tuple[str, int]] = {}  # host -> (boot, contiguous)
        # Frames accepted but not yet committed (see batch/flush), and the state of each
        # (host, boot) they touched as it was before them.
        self._staged: list[tuple[HostState, SeqState, Frame, bytes, float, Outcome]] = []
        self._before: dict[tuple[str, str], tuple[SeqState, int, int, set[int]]] = {}
        self._batching = False
        self._last_log: dict[str, float] = {}
        # set when [federation] is: what of a committed frame this aggregator diagnoses, the
        # rest queued for the job's owner
        self.federation: Federation | None = None
        self._load_hosts()

    def _load_hosts(self) -> None:
        for name, boot, hello, first, last in self.store.hosts():
            h = self.registry.get(name)
            h.boot, h.hello, h.first_seen, h.last_seen = boot, hello, first, last

    # -- frames in ------------------------------------------------------------------------
    def handle(self, data: bytes, now: float, identity: str | None = None) -> Outcome:
        """`identity`: the host the connection's CURVE key is enrolled for ("" if the key was
        revoked since it connected); None where there is no key (replay, `insecure = true`)."""
        return self.admit(self.prepare(data, identity), data, now)

    def prepare(self, data: bytes, identity: str | None = None) -> Frame | Exception:
        """Decode and check one frame: the Frame, or the Rejected (or a decoder bug) that
        `admit` counts. Reads no state that ingest changes, so the server runs it outside
        its lock, in arrival order, and admits the results in the same order."""
        try:
            frame = self.decode(data)
            if identity is not None and frame.host != identity:
                # One key speaks for one host: a frame naming another is forged or misrouted.
                raise Rejected("identity", f"frame names host {frame.host!r} but this "
                               "connection's key " + (f"is enrolled for {identity!r}" if identity
                                                      else "is no longer enrolled"),
                               frame.to_dict())
            return frame
        except Exception as exc:  # Rejected, or a decoder bug: it must cost this frame only
            return exc

    def admit(self, prepared: Frame | Exception, data: bytes, now: float) -> Outcome:
        """Accept what `prepare` returned for `data`, or count and answer its reject."""
        if isinstance(prepared, Frame):
            return self.accept(prepared, data, now)
        if not isinstance(prepared, Rejected):
            self.internal_error("decode", prepared, now)
            prepared = Rejected("internal", f"cannot decode: {type(prepared).__name__}")
        return self.reject(prepared, now)

    def decode(self, data: bytes) -> Frame:
        """Decode and validate an agent's frame, or raise Rejected."""
        frame = fast.decode(data, self.max_frame)  # wire.decode, body checked in C
        if frame.kind not in kinds.FROM_AGENT:
            raise Rejected("unexpected_kind",
                           f"{frame.kind!r} travels aggregator -> agent only", frame.to_dict())
        return frame

    def accept(self, frame: Frame, data: bytes, now: float) -> Outcome:
        """Store and apply a frame `decode` returned (`data`: its bytes as received)."""
        if frame.host not in self.registry.hosts and not self._room_for_host(now):
            return self.reject(Rejected("host_limit", f"{len(self.registry.hosts)} hosts known "
                                        "(max_hosts) and none is silent", frame.to_dict()), now)
        h = self.registry.get(frame.host)
        seqs = self._seq_state(h, frame.boot)
        key = (h.name, frame.boot)
        if key not in self._before:  # what a failed commit of this batch returns to
            self._before[key] = (seqs, seqs.contiguous, seqs.lost, set(seqs.above))
        if frame.floor is not None:
            seqs.settle_below(frame.floor)
        if seqs.seen(frame.seq):  # settling needs no write: the floor comes with every frame
            self.duplicates += 1
            self.pending_acks[h.name] = (frame.boot, seqs.contiguous)
            out = Outcome(frame=frame, duplicate=True)
        else:
            seqs.add(frame.seq)  # in memory only: undone unless the batch commits (flush)
            out = Outcome(frame=frame)
            self._staged.append((h, seqs, frame, data, now, out))
        if not self._batching:
            self.flush()
        return out

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Frames handled inside are stored in one transaction, at `take_acks` or at the end,
        instead of one transaction each; applied and observed only once committed."""
        self._batching = True
        try:
            yield
        finally:
            self._batching = False
            self.flush()

    def flush(self) -> None:
        """Commit the staged frames and their sequence state in one transaction; then, and only
        then, they count for acks, host state and diagnosis, in arrival order. A failed commit
        restores every sequence state the batch touched: an advanced counter would ack the
        agent's resend as a duplicate and the frame would be lost; unacked, it is resent."""
        staged, before = self._staged, self._before
        self._staged, self._before = [], {}
        if not staged:
            return
        now = staged[-1][4]
        try:
            self.store.begin()
            self.store.insert_frames([(h.name, f.boot, f.seq, f.kind, f.ts, t, data)
                                      for h, _, f, data, t, _ in staged])
            self.store.save_seqs([(host, boot, s.contiguous, s.lost)
                                  for (host, boot), (s, *_) in before.items()])
            for h, _, f, _, t, _ in staged:
                if f.kind == "hello":
                    self.store.save_host(h.name, f.boot, f.body, h.first_seen or t, t)
            self.store.commit()
        except Exception as exc:
            self.store.rollback()
            for (host, boot), (s, contiguous, lost, above) in before.items():
                s.contiguous, s.lost, s.above = contiguous, lost, above
                if self.pending_acks.get(host, ("",))[0] == boot:
                    self.pending_acks[host] = (boot, contiguous)
            if isinstance(exc, sqlite3.Error):
                self._store_failed(exc, now, len(staged))
                for *_, out in staged:
                    out.reject = "store_error"
            else:
                self.internal_error("store", exc, now)
                for _, _, f, _, t, out in staged:  # a reply reaches the agent outside a batch
                    r = self.reject(Rejected("internal", f"cannot store: {type(exc).__name__}",
                                             f.to_dict()), t)
                    out.reject, out.replies = r.reject, r.replies
            return
        if self.store.failing is not None:
            self._store_recovered(now)
        for h, seqs, frame, _, t, _ in staged:
            self.accepted[frame.kind] += 1
            self.pending_acks[h.name] = (frame.boot, seqs.contiguous)
            try:
                self._apply(h, frame, t)
                local = frame if self.federation is None else self.federation.local(frame, t)
                if self.diagnosis is not None and local is not None:
                    self.diagnosis.observe(local, t)
            except Exception as exc:  # stored, so acked: only what it would have changed is lost
                self.internal_error("apply", exc, t)
        if self.store.frame_bytes > self.retention_bytes * (1 + PRUNE_SLACK):
            self._prune_bytes(now)

    def _room_for_host(self, now: float) -> bool:
        """Below max_hosts, or the host silent longest made room: made-up names cannot grow
        the registry (and every per-host loop) without bound."""
        hosts = self.registry.hosts
        if len(hosts) < self.max_hosts:
            return True
        silent = [h for h in hosts.values() if h.status == "silent"]
        if not silent:
            return False
        self._forget(min(silent, key=lambda h: h.last_seen).name, now, "max_hosts reached")
        return True

    def _forget(self, name: str, now: float, why: str) -> None:
        self.registry.hosts.pop(name, None)
        self.pending_acks.pop(name, None)
        try:
            self.store.forget_host(name)
        except sqlite3.Error as exc:  # it comes back at restart, and goes again
            self._log_limited("forget", f"cannot forget host {name} in the database: {exc}", now)
        self.log.info("host %s forgotten: %s", name, why)

    def _seq_state(self, h: HostState, boot: str) -> SeqState:
        s = h.seqs.get(boot)
        if s is None:
            contiguous, lost = self.store.load_seq(h.name, boot)
            s = SeqState(contiguous=contiguous, lost=lost)
            s.above = set(self.store.stored_seqs_above(h.name, boot, contiguous))
            s._advance()
            h.seqs[boot] = s
            while len(h.seqs) > BOOTS_KEPT:
                h.seqs.pop(next(iter(h.seqs)))
        return s

    def _apply(self, h: HostState, frame: Frame, now: float) -> None:
        if not h.first_seen:
            h.first_seen = now
        h.last_seen = now
        h.last_agent_ts = frame.ts
        if frame.kind == "hello" or not h.boot:
            h.boot = frame.boot
        if frame.kind == "hello":
            h.hello = frame.body
        elif frame.kind == "report":
            h.last_report = frame.body
            h.reports += 1
        elif frame.kind == "event":
            h.events.append({"ts": frame.ts, "received": now, **frame.body})
        if h.status == "silent":
            h.status = "up"
            self.log.info("host %s is back", h.name)
            if self.diagnosis is not None:
                self.diagnosis.host_back(h.name, now)

    def reject(self, exc: Rejected, now: float) -> Outcome:
        self.rejected[exc.code] += 1
        env = exc.frame or {}
        host = env.get("host")  # unchecked when the envelope was bad: log a bounded name only
        host = host if isinstance(host, str) and len(host) <= kinds.HOST.max_len else None
        if host and host in self.registry.hosts:
            self.registry.hosts[host].rejected += 1
        self._log_limited(exc.code, f"rejected frame from {host or 'unknown peer'}: {exc}", now)
        body: dict[str, Any] = {"code": exc.code, "reason": exc.detail[:1024], "ref_seq": None}
        for key, spec in (("ref_seq", SEQ), ("ref_boot", IDENT)):  # the frame's seq and boot
            try:  # (a spool resends several incarnations), echoed only when valid
                body[key] = spec.check(env.get(key[4:]))
            except Invalid:
                pass
        if exc.code == "unsupported_version":
            body["supported"] = list(wire.SUPPORTED_MAJORS)
        return Outcome(reject=exc.code, replies=[self._frame("error", body, now)])

    def _store_failed(self, exc: sqlite3.Error, now: float, frames: int = 1) -> None:
        """Full disk, read-only or broken database: frames are not acked (the agents keep and
        resend them), reads and everyone else go on, /healthz reports it until a commit works."""
        self.store_errors += frames
        if self.store.failing is None:
            self.store.failing = (str(exc), now)
            self.log.error("the database cannot be written (%s): frames are not acked until it "
                           "can; the agents hold and resend them", exc)
        else:
            self._log_limited("store", f"the database still cannot be written: {exc} "
                              f"({self.store_errors} frames refused so far)", now)

    def _store_recovered(self, now: float) -> None:
        error, since = self.store.failing or ("", now)
        self.store.failing = None
        self.log.warning("the database can be written again after %.0f s (%s): acking resumes",
                         now - since, error)

    def internal_error(self, where: str, exc: BaseException, now: float) -> None:
        """Count and log a failure of our own code that was contained (`where`: decode,
        diagnosis, tick, ...): the traceback once per place, then one line per 10 s."""
        self.errors[where] += 1
        if self.errors[where] == 1:
            self.log.error("internal error in %s (contained; counted in /api/v1/stats "
                           "errors.%s)", where, where, exc_info=exc)
            self._last_log[f"internal:{where}"] = now
        else:
            self._log_limited(f"internal:{where}", f"internal error in {where} again "
                              f"({self.errors[where]} so far): {type(exc).__name__}", now)

    def _log_limited(self, key: str, msg: str, now: float) -> None:
        # A hostile or broken agent must not flood the log: one line per reason per 10 s.
        if now - self._last_log.get(key, -1e18) >= 10.0:
            self._last_log[key] = now
            self.log.warning("%s", msg)

    # -- frames out -----------------------------------------------------------------------
    def _frame(self, kind: str, body: dict[str, Any], now: float) -> Frame:
        self._seq += 1
        return Frame(kind, self.name, self.boot, self._seq, now, body)

    def take_acks(self, now: float) -> list[tuple[str, Frame]]:
        """(host, ack frame) for every host that sent something since the last call; what
        is staged is committed first, so an ack never covers a frame not stored."""
        self.flush()
        out = [(host, self._frame("ack", {"boot": boot, "seq": seq}, now))
               for host, (boot, seq) in self.pending_acks.items()]
        self.pending_acks.clear()
        return out

    def make_frame(self, kind: str, body: dict[str, Any], now: float | None = None) -> Frame:
        return self._frame(kind, body, time.time() if now is None else now)

    # -- time -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        for h in self.registry.hosts.values():
            if h.status == "up" and h.last_seen and now > self.registry.silent_deadline(
                    h, self.silent_after):
                h.status = "silent"
                self.log.warning("host %s is silent (last frame %.1fs ago)", h.name,
                                 now - h.last_seen)
                if self.diagnosis is not None:
                    self.diagnosis.host_silent(h.name, h.last_seen, now)
        if self.diagnosis is not None:
            try:
                self.diagnosis.tick(now)
            except Exception as exc:  # the next tick tries again
                self.internal_error("tick", exc, now)

    def prune(self, now: float) -> None:
        for h in [h for h in self.registry.hosts.values()
                  if h.status == "silent" and now - h.last_seen > self.host_expiry_s]:
            self._forget(h.name, now, f"silent for more than {self.host_expiry_s:.0f} s")
        try:
            self.store.prune(now - self.retention_s)
        except sqlite3.Error as exc:
            self.store_errors += 1
            self._log_limited("prune", f"cannot prune old frames: {exc}", now)
        self._prune_bytes(now)

    def _prune_bytes(self, now: float) -> None:
        """Keep at most retention_bytes of raw frames (oldest go first), PRUNE_SLACK below."""
        try:
            self.store.prune_bytes(int(self.retention_bytes * (1 - PRUNE_SLACK)))
        except sqlite3.Error as exc:
            self.store_errors += 1
            self._log_limited("prune", f"cannot prune old frames: {exc}", now)

    def stats(self) -> dict[str, Any]:
        return {
            "accepted": dict(self.accepted),
            "rejected": {r: self.rejected.get(r, 0) for r in wire.REJECT_REASONS},
            "duplicates": self.duplicates,
            "store_errors": self.store_errors,
            "errors": dict(self.errors),
            "hosts": len(self.registry.hosts),
            "hosts_silent": sum(1 for h in self.registry.hosts.values() if h.status == "silent"),
            **({"federation": self.federation.stats()} if self.federation is not None else {}),
        }
