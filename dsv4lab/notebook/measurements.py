"""One headline per figure: each throughput a step measured, what it was measured on, and which one leads.

A campaign measures the same config many times: Config A at concurrency 16 is benchmarked in step 01, is
the A arm of three lever A/Bs (on shorter outputs), is one arm of the MTP A/B and the profile's load run.
Those are five honest numbers (15 to 21 tok/s: different workloads, one run or three) and a page that
shows them side by side under one name reads as five answers to one question. So every step records its
measurements with their workload and repeats (:meth:`dsv4lab.notebook.experiment.Experiment.measured`), and pages
lead with one :func:`headline` per config and concurrency — the one with the most repeats — and list the
others as what they are.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dsv4lab.counts import plural
from dsv4lab.units import fmt_tok_s

__all__ = ["Measurement", "by_config", "headline", "measurements"]

#: Which measurement leads when repeats tie: an A/B's interleaved repeats, then a plain benchmark.
_ROLE_RANK = {"A/B": 0, "benchmark": 1}


@dataclass(frozen=True)
class Measurement:
    """Output throughput of one config at one concurrency on one workload, on the reader's clock."""

    config: str
    concurrency: int | None
    output_tok_s: float
    repeats: int
    workload: str
    role: str
    ci: tuple[float, float] | None = None
    clock: str = "measured"
    step: str = ""

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.config, self.concurrency)

    def value_text(self) -> str:
        """``"20.5 tok/s (95% CI 19.6 to 21.4)"``."""
        ci = f" (95% CI {self.ci[0]:,.1f} to {self.ci[1]:,.1f})" if self.ci else ""
        return f"{fmt_tok_s(self.output_tok_s)}{ci}"

    def basis(self) -> str:
        """What the value rests on: ``"mean of 3 runs, 8,000 in / 256 out tokens per request, A/B"``."""
        runs = f"mean of {plural(self.repeats, 'run')}" if self.repeats > 1 else "1 run"
        parts = [runs, self.workload or "workload not recorded", self.role]
        if self.step:
            parts.append(f"step {self.step}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["ci"] = list(self.ci) if self.ci else None
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, step: str = "") -> Measurement:
        ci = data.get("ci")
        return cls(
            config=str(data["config"]),
            concurrency=None if data.get("concurrency") is None else int(data["concurrency"]),
            output_tok_s=float(data["output_tok_s"]),
            repeats=int(data.get("repeats", 1)),
            workload=str(data.get("workload") or ""),
            role=str(data.get("role") or ""),
            ci=(float(ci[0]), float(ci[1])) if isinstance(ci, (list, tuple)) and len(ci) == 2 else None,
            clock=str(data.get("clock") or "measured"),
            step=step or str(data.get("step") or ""),
        )


def _runs_of(source: Any) -> list[Any]:
    """BenchResults from a BenchRuns, a list of them, or an ABRuns (both arms)."""
    if hasattr(source, "a") and hasattr(source, "b"):
        return [*source.a, *source.b]
    return list(source)


def measurements(source: Any, *, role: str) -> list[Measurement]:
    """The measurements in ``source`` (runs of a sweep, a benchmark, or both arms of an A/B): complete runs
    grouped by config, concurrency and workload, each group's mean (and a 95 % CI from two repeats on)."""
    from dsv4lab.bench.stats import t_quantile

    groups: dict[tuple[str, int | None, str], list[float]] = {}
    clocks: dict[tuple[str, int | None, str], str] = {}
    for r in _runs_of(source):
        if r.partial or not r.summary.completed:
            continue
        key = (r.label or "unnamed", r.concurrency, r.workload_text)
        groups.setdefault(key, []).append(r.on_hardware.output_throughput)
        clocks[key] = r.clock.reading
    out = []
    for (config, concurrency, workload), values in groups.items():
        mean = statistics.fmean(values)
        ci = None
        if len(values) >= 2:
            half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
            ci = (mean - half, mean + half)
        out.append(
            Measurement(
                config, concurrency, mean, len(values), workload, role, ci, clocks[(config, concurrency, workload)]
            )
        )
    return out


def headline(items: Sequence[Measurement]) -> Measurement:
    """The measurement a page leads with: the most repeats; then an A/B's over a plain benchmark's; then
    the latest (a campaign's later steps re-measure what earlier ones found)."""
    if not items:
        raise ValueError("no measurements to choose a headline from")
    ranked = sorted(enumerate(items), key=lambda im: (-im[1].repeats, _ROLE_RANK.get(im[1].role, 2), -im[0]))
    return ranked[0][1]


def by_config(items: Iterable[Measurement]) -> list[tuple[Measurement, list[Measurement]]]:
    """Per config and concurrency (in the order first measured): the headline and the other measurements."""
    grouped: dict[tuple[str, int | None], list[Measurement]] = {}
    for m in items:
        grouped.setdefault(m.key, []).append(m)
    out = []
    for group in grouped.values():
        lead = headline(group)
        out.append((lead, [m for m in group if m is not lead]))
    return out
