"""The verdict on one log and its JSON contract: outcome, phase, cause, confidence, evidence, fixes.

Kept apart from the reading (``judge``) because notebooks, the watcher and scripts depend on this shape,
while the rules that fill it change as more real logs are read. ``to_dict()`` is the ``dsv4lab diagnose
--json`` contract.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from dsv4lab.counts import plural
from dsv4lab.logs.events import Engine, Phase
from dsv4lab.logs.fixes import Fix

__all__ = ["Diagnosis", "Outcome", "unknown"]


class Outcome(str, Enum):
    """How a run ended, as far as the log can tell.

    ``STALLED`` is a verdict about a live process (alive, writing nothing): only a watcher that checks
    liveness can give it, never a file. A file that simply stops mid-startup is ``UNKNOWN``.
    """

    READY = "ready"
    OOM = "oom"
    CRASH = "crash"
    STALLED = "stalled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Diagnosis:
    """The verdict on one log (its last run). ``to_dict()`` is the JSON contract scripts rely on."""

    engine: Engine | None
    outcome: Outcome
    phase: Phase | None
    cause: str
    confidence: float
    gpu: int | None = None
    rank: int | None = None
    tried_to_allocate_gib: float | None = None
    free_gib: float | None = None
    total_gib: float | None = None
    evidence: tuple[str, ...] = ()
    fixes: tuple[Fix, ...] = ()
    truncated: bool = False
    notes: tuple[str, ...] = ()
    figures: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    lines_read: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict: engine, outcome, phase, gpu, tried_to_allocate_gib, free_gib, total_gib,
        cause, evidence, fixes [{change, why}], confidence (+ rank, truncated, notes, figures, lines_read)."""
        return {
            "engine": self.engine.value if self.engine else None,
            "outcome": self.outcome.value,
            "phase": self.phase.value if self.phase else None,
            "gpu": self.gpu,
            "rank": self.rank,
            "tried_to_allocate_gib": _round(self.tried_to_allocate_gib),
            "free_gib": _round(self.free_gib),
            "total_gib": _round(self.total_gib),
            "cause": self.cause,
            "evidence": list(self.evidence),
            "fixes": [f.to_dict() for f in self.fixes],
            "confidence": round(self.confidence, 2),
            "truncated": self.truncated,
            "notes": list(self.notes),
            "figures": {k: _round(v) if isinstance(v, float) else v for k, v in self.figures.items()},
            "lines_read": self.lines_read,
        }

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        states: dict[Outcome, hv.State] = {
            Outcome.READY: "ok",
            Outcome.OOM: "fail",
            Outcome.CRASH: "fail",
            Outcome.STALLED: "warn",
            Outcome.UNKNOWN: "info",
        }
        rows: list[tuple[str, object]] = [
            ("engine", self.engine.value if self.engine else "—"),
            ("phase", self.phase.value if self.phase else "—"),
            ("confidence", f"{self.confidence:.2f}" + (" (log truncated)" if self.truncated else "")),
        ]
        if self.gpu is not None:
            rows.append(("GPU", str(self.gpu)))
        for label, value in (
            ("tried to allocate", self.tried_to_allocate_gib),
            ("free", self.free_gib),
            ("total", self.total_gib),
        ):
            if value is not None:
                rows.append((label, f"{value:.2f} GiB"))
        body = hv.p(self.cause) + hv.kv_table(rows)
        if self.fixes:
            fixes = [{"change": hv.raw(f"<code>{hv.esc(f.change)}</code>"), "why": f.why} for f in self.fixes]
            body += hv.p("Fixes") + hv.table(fixes, max_rows=8)
        for note in self.notes:
            body += hv.p(f"Note: {note}")
        if self.evidence:
            body += hv.fold(
                list(self.evidence), keep=12, summary=f"earlier evidence ({plural(len(self.evidence), 'line')})"
            )
        return hv.card("diagnosis", body, state=states[self.outcome], status=self.outcome.value.upper())


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


def unknown(cause: str, lines: int = 0, engine: Engine | None = None, notes: tuple[str, ...] = ()) -> Diagnosis:
    """A verdict of ``unknown`` with no phase and zero confidence: the log could not be judged at all."""
    return Diagnosis(
        engine=engine, outcome=Outcome.UNKNOWN, phase=None, cause=cause, confidence=0.0, lines_read=lines, notes=notes
    )
