"""What detectors produce: a finding (one symptom, possibly localised) with ranked suspects.
The incident manager (incidents.py) turns findings into deduplicated incidents."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from c4.core.catalog import INCIDENT_CLASSES as CLASS_RANK

__all__ = ["CLASS_RANK", "Finding", "Suspect", "describe", "renamed"]  # CLASS_RANK: the catalog's, for the aggregator


@dataclass
class Suspect:
    kind: str  # host | nic | link | rank | gpu
    id: str
    host: str | None = None
    rank: int | None = None
    confidence: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.id}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "id": self.id, "host": self.host, "rank": self.rank,
                "confidence": round(self.confidence, 3)}


@dataclass
class Finding:
    cls: str
    job: str | None
    comm: str | None
    suspects: list[Suspect]
    summary: str
    evidence: dict[str, Any]
    first_symptom: float
    matrix: dict[str, Any] | None = None
    hold_s: float | None = None  # resolution hold-down; None: the configured default
    direct: bool = False  # a device reported it (no inference): localised at once
    aliases: tuple[str, ...] = ()  # keys of components indistinguishable from the top suspect
    # keys of components named earlier for the same fault, on part of the evidence: their
    # incidents are this one (incidents.py re-names or merges them)
    supersedes: tuple[str, ...] = ()

    @property
    def top(self) -> Suspect | None:
        return self.suspects[0] if self.suspects else None

    @property
    def scope(self) -> str:
        """Dedupe key of an unlocalised symptom: one per class and communicator (or job). A
        hang is one symptom whichever rule names it (first no suspect, then a culprit)."""
        cls = "comm_hang" if self.cls == "noncomm_hang" else self.cls
        return f"{cls}:{self.comm or self.job or '-'}"


def describe(top: Suspect, confidence: float) -> str:
    """How a finding's summary names its top suspect: by name only when it is sure enough."""
    if top.kind == "path":
        return f"path {top.id} ({top.confidence:.2f}: its links cannot be told apart)"
    return f"{top.kind} {top.id}" if top.confidence >= confidence else \
        "no single component (ambiguous)"


def renamed(summary: str, top: Suspect, confidence: float) -> str:
    """A finding's summary once a tie-break (the measuring probes, a blackhole's way) named its
    top suspect: its closing "suspect: ..." says what it names now, not "ambiguous"."""
    head, sep, _ = summary.rpartition("; suspect: ")
    return f"{head}{sep}{describe(top, confidence)}" if sep else summary
