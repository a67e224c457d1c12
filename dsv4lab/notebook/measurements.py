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

__all__ = ["Measurement", "by_config", "frontier_rows", "gpus_of", "headline", "measurements"]

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
    #: The mean of the runs' median TPOT (ms, on the same clock): what a user sees, for the frontier.
    tpot_ms: float | None = None
    #: The GPUs the server used (its config's parallelism), for throughput per GPU.
    gpus: int | None = None

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
            tpot_ms=None if data.get("tpot_ms") is None else float(data["tpot_ms"]),
            gpus=None if data.get("gpus") is None else int(data["gpus"]),
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
    tpots: dict[tuple[str, int | None, str], list[float]] = {}
    clocks: dict[tuple[str, int | None, str], str] = {}
    gpus: dict[tuple[str, int | None, str], int | None] = {}
    for r in _runs_of(source):
        if r.partial or not r.summary.completed:
            continue
        key = (r.label or "unnamed", r.concurrency, r.workload_text)
        groups.setdefault(key, []).append(r.on_hardware.output_throughput)
        tpot = r.on_hardware.tpot_ms.median
        if math.isfinite(tpot):
            tpots.setdefault(key, []).append(tpot)
        clocks[key] = r.clock.reading
        gpus[key] = gpus_of(r)
    out = []
    for (config, concurrency, workload), values in groups.items():
        mean = statistics.fmean(values)
        ci = None
        if len(values) >= 2:
            half = t_quantile(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
            ci = (mean - half, mean + half)
        key = (config, concurrency, workload)
        tpot = statistics.fmean(tpots[key]) if tpots.get(key) else None
        out.append(
            Measurement(config, concurrency, mean, len(values), workload, role, ci, clocks[key], "", tpot, gpus[key])
        )
    return out


def gpus_of(result: Any) -> int | None:
    """The GPUs a run's server used: the GPUs it reported, else its config's tensor x data parallelism (DP
    attention shares the tensor-parallel GPUs); None when the record does not say."""
    names = result.provenance.gpu_names
    if names:
        return len(names)
    config = result.provenance.config or {}
    tp = config.get("tp") or config.get("tensor_parallel_size")
    if not tp:
        return None
    dp = config.get("dp") or config.get("data_parallel_size") or 1
    shared = "--enable-dp-attention" in (config.get("extra_args") or [])
    return int(tp) if shared else int(tp) * int(dp)


def frontier_rows(items: Iterable[Measurement]) -> list[dict[str, Any]]:
    """The frontier's rows (:func:`dsv4lab.plots.frontier.frontier_chart`) from measurements: the headline per
    config and concurrency that has a TPOT, per GPU by the config's GPU count (from any of its measurements
    that recorded it); no SLO is known here, so every point meets it."""
    items = list(items)
    gpus = {m.config: m.gpus for m in items if m.gpus}
    rows = []
    for lead, _ in by_config(items):
        count = lead.gpus or gpus.get(lead.config)
        if lead.tpot_ms is None or not lead.tpot_ms > 0 or not count:
            continue
        rows.append(
            {
                "config": lead.config,
                "concurrency": lead.concurrency,
                "tok_s_per_user": 1000.0 / lead.tpot_ms,
                "tok_s_per_gpu": lead.output_tok_s / count,
                "meets_slo": True,
            }
        )
    return rows


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
