"""Collective counts and ordinals: the one definition the plugin, the agent, the simulator and
diagnosis share (docs/wire.md, "Collective ordinals").

Per communicator and rank, counted by the NCCL profiler plugin (plugin/src/events.c):
- `seq_started`, `seq_completed` are *counts*: collectives started / completed since the
  communicator was created (0 before the first).
- An *ordinal* numbers the collectives from 0: the first is ordinal 0, the one that takes
  `seq_started` from n to n + 1 is ordinal n. `inflight.seq` and the `nccl_stall` event's
  `seq` are ordinals: the oldest incomplete operation. After n collectives started and k
  completed (in stream order) it is k, the in-flight op after n started is at most n - 1.
- A point-to-point op is numbered by the collectives started before it: its ordinal is the
  next collective's, which it has *not* entered.
So counts and ordinals compare only through the helpers below; `count < ordinal` style tests
are off by one.
"""
from __future__ import annotations

from typing import Any

FIRST = 0  # ordinal of a communicator's first collective
P2P_FUNCS = frozenset({"Send", "Recv", "SendRecv"})  # in-flight funcs that are not collectives


def next_ordinal(seq_started: int) -> int:
    """The ordinal the rank's next collective will have (it has not entered it)."""
    return seq_started


def entered(seq_started: int, ordinal: int) -> bool:
    """Whether a rank that has started `seq_started` collectives has entered `ordinal`."""
    return seq_started > ordinal


def oldest_incomplete(seq_started: int, seq_completed: int) -> int | None:
    """The ordinal of the oldest incomplete collective (ops complete in stream order), None
    when every started collective completed."""
    return seq_completed if seq_started > seq_completed else None


def position(seq_started: int, inflight: dict[str, Any] | None) -> tuple[int, bool]:
    """Where a rank stands: (ordinal, inside it). A rank in a collective is inside its
    ordinal; an idle rank, or one in a point-to-point op, waits to enter `seq_started`."""
    if inflight is not None and inflight.get("func") not in P2P_FUNCS:
        return int(inflight["seq"]), True
    return next_ordinal(seq_started), False


def behind(seq_started: int, inflight: dict[str, Any] | None, ordinal: int) -> bool:
    """Whether a rank has not (yet) entered collective `ordinal`: in an older one, or waiting
    to enter it or an older one."""
    at, inside = position(seq_started, inflight)
    return at < ordinal or (at == ordinal and not inside)


# "Stalled" and "hung", and how they relate. The plugin calls an operation *stalled* when it
# has been in flight with no progress for C4_STALL_MS (plugin/src/plugin.c, default below) and
# then sends a `stalled` message at once (the agent's `nccl_stall` event) instead of waiting
# for its next summary: evidence (who waits on whom, in which state), not a verdict. Diagnosis
# calls a collective *hung* when no rank progressed for `hang_floor_s` and for `hang_op_factor`
# times the job's own pace (aggregator/diagnosis/config.py). The stall threshold must not be
# longer than the hang floor, or the evidence arrives after the verdict is due: both default to
# the value below, and tests/unit/test_ordinals_stall.py holds the plugin's C default to it.
STALL_S_DEFAULT = 5.0
