"""The figures a campaign step reports, computed from its data — the logic the notebooks only call.

Every number a report states comes from here or from the objects it returns: throughputs per level on
the modelled hardware, an A/B lever as a relative change with its interval and verdict, the candidate
fixes of an OOM each checked by the memory model and the one chosen, the graph memory of each runner,
the roofline of a decode step. Keeping them here keeps the notebooks to a few lines a cell and lets the
same figures be tested without a kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from dsv4lab.bench import ABComparison, BenchResult
from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError
from dsv4lab.logs import Diagnosis
from dsv4lab.model.memory import DEFAULT_MARGIN_GIB, Preflight, preflight, suggest
from dsv4lab.notebook.experiment import overrides_text, read_results
from dsv4lab.tables import Table, table

__all__ = [
    "FixCandidate",
    "ab_figure",
    "budget_table",
    "candidates_frame",
    "cheap_levers",
    "chosen_fix",
    "diagnosis_figures",
    "fix_candidates",
    "fix_figures",
    "gap_figures",
    "graph_table",
    "mtp_bounds",
    "server_dir",
    "throughput_figures",
]


def throughput_figures(runs: Sequence[BenchResult], *, prefix: str = "output_throughput") -> dict[str, float]:
    """``{"output_throughput_c1": ..., "output_throughput_c16": ...}``: mean output tok/s per level on the
    hardware (:attr:`BenchResult.on_hardware`), over the level's complete runs that completed a request."""
    levels: dict[int, list[float]] = {}
    for r in runs:
        if r.partial or r.concurrency is None or not r.summary.completed:
            continue
        levels.setdefault(r.concurrency, []).append(r.on_hardware.output_throughput)
    return {f"{prefix}_c{c}": sum(v) / len(v) for c, v in sorted(levels.items())}


def ab_figure(comparison: ABComparison, concurrency: int | None = None) -> dict[str, Any]:
    """One lever at one level as the campaign index shows it: B vs A relative change, its 95 % CI, the
    verdict, and both means on the hardware (the first level when ``concurrency`` is not given)."""
    level = comparison.at(concurrency) if concurrency is not None else comparison.levels[0]
    lo, hi = level.rel_ci
    return {
        "rel": level.rel_diff,
        "ci": [lo, hi],
        "verdict": level.verdict,
        "concurrency": level.concurrency,
        "a": comparison.label_a,
        "b": comparison.label_b,
        "mean_a": level.mean_a,
        "mean_b": level.mean_b,
        "repeats": [level.n_a, level.n_b],
        "workload": comparison.workload,
    }


def server_dir(path: str | Path, *, key: str = "server_dir") -> Path:
    """The folder with a server's ``server.log``, from a path a user or a campaign passes: that folder itself,
    or a notebook's run dir whose ``results.json`` names it (``figures.server_dir``)."""
    p = Path(path).expanduser()
    if not str(path).strip():
        raise ConfigError("run dir", str(path), "the run dir of an earlier step (it is empty)")
    if (p / "server.log").is_file():
        return p.resolve()
    named = read_results(p).get("figures", {}).get(key) if p.is_dir() else None
    if isinstance(named, str) and (Path(named) / "server.log").is_file():
        return Path(named).resolve()
    raise ConfigError("run dir", str(path), "a folder with server.log, or a run dir whose results.json names one")


@dataclass(frozen=True)
class FixCandidate:
    """A change that might let the config start, with the memory model's verdict on it."""

    flags: str
    overrides: Mapping[str, str]
    source: str
    fits: bool
    headroom_gib: float
    kv_tokens: int
    why: str

    @property
    def origin(self) -> str:
        """Where the change came from, in words: ``both changes the diagnosis proposed``."""
        return {
            "diagnosis": "proposed by the diagnosis",
            "diagnosis (both)": "both changes the diagnosis proposed",
            "memory model": "suggested by the memory model",
        }.get(self.source, self.source)


def fix_candidates(
    diagnosis: Diagnosis,
    config: ServerConfig,
    hardware: HardwareProfile,
    *,
    sglang_version: str,
    margin_gib: float = DEFAULT_MARGIN_GIB,
) -> list[FixCandidate]:
    """The diagnosis's fixes that set a modelled field, their combination, and the model's own suggestions,
    each checked with :func:`~dsv4lab.model.memory.preflight` (best first: fits, then the most headroom)."""
    from dsv4lab.config.versions import flags_owned_by_fields, resolve_release

    owned = flags_owned_by_fields()
    release = resolve_release(sglang_version, warn=False)
    seen: set[tuple[tuple[str, str], ...]] = set()
    out: list[FixCandidate] = []

    def add(overrides: dict[str, str], source: str, why: str) -> None:
        key = tuple(sorted(overrides.items()))
        if not overrides or key in seen:
            return
        seen.add(key)
        try:
            p = preflight(config.with_values(overrides), hardware, sglang_version=sglang_version)
        except ConfigError:
            return
        flags = " ".join(f"{release.flag_for(k) or '--' + k.replace('_', '-')} {v}" for k, v in overrides.items())
        out.append(FixCandidate(flags, overrides, source, p.fits, p.min_headroom_gib, p.kv_tokens, why))

    levers: dict[str, str] = {}
    for fix in diagnosis.fixes:
        words = fix.change.split()
        pairs = {owned.get(words[i]): words[i + 1] for i in range(0, len(words) - 1, 2) if owned.get(words[i])}
        pairs = {k: v for k, v in pairs.items() if k in ("mem_fraction_static", "cuda_graph_max_bs")}
        if pairs:
            add({str(k): v for k, v in pairs.items()}, "diagnosis (both)" if len(pairs) > 1 else "diagnosis", fix.why)
            for k, v in pairs.items():
                levers.setdefault(str(k), v)
    if len(levers) == 2:
        add(dict(levers), "diagnosis (both)", "both changes the diagnosis proposes, together")
    for s in suggest(config, hardware, sglang_version=sglang_version, margin_gib=margin_gib):
        add({k: str(v) for k, v in s.changes.items()}, "memory model", s.why)
    out.sort(key=lambda c: (not c.fits, -c.headroom_gib))
    return out


def chosen_fix(candidates: Sequence[FixCandidate], *, margin_gib: float = DEFAULT_MARGIN_GIB) -> FixCandidate:
    """The story's choice rule: the diagnosis's own levers together when they fit with the margin (both
    knobs the user already knows), else the fitting candidate with the most headroom."""
    fitting = [c for c in candidates if c.fits and c.headroom_gib >= margin_gib]
    both = [c for c in fitting if c.source == "diagnosis (both)"]
    if both:
        return both[0]
    if fitting:
        return fitting[0]
    if candidates and candidates[0].fits:
        return candidates[0]
    raise ConfigError("fix", None, "a change the memory model predicts to fit: none of the candidates does")


def candidates_frame(candidates: Sequence[FixCandidate]) -> Table:
    """The candidates as a table a report can show: the flags, where they came from, the model's verdict
    (fits first, then the most headroom; a negative headroom is the shortfall)."""
    rows = [
        {
            "change": c.flags,
            "from": c.source,
            "predicted": "fits" if c.fits else f"OOM, short by {-c.headroom_gib:.1f} GiB",
            "headroom (GiB)": round(c.headroom_gib, 1),
            "KV pool (tokens)": c.kv_tokens,
        }
        for c in candidates
    ]
    return table(rows, title="candidate fixes, each checked by the memory model")


def graph_table(*preflights: tuple[str, Preflight]) -> Table:
    """The CUDA-graph runners each config captures and their memory: why verify and draft graphs need more."""
    rows = [
        {
            "config": name,
            "runner": g.runner,
            "role": g.role,
            "tokens per request": g.tokens_per_request,
            "max batch (requests)": g.max_bs,
            "graph memory (GiB)": round(g.gib, 2),
        }
        for name, p in preflights
        for g in p.graphs
    ]
    return table(rows, title="CUDA graphs each config captures (memory model, per GPU)")


def budget_table(comparison: pd.DataFrame) -> Table:
    """:func:`dsv4lab.model.budget.compare_budgets`'s per-GPU rows folded into one row per category: the
    predicted and observed GiB (a range where the GPUs differ) and on how many GPUs they agree."""

    def span(values: pd.Series) -> str:
        nums = [float(v) for v in values if v is not None and not pd.isna(v)]
        if not nums:
            return "–"
        lo, hi = min(nums), max(nums)
        return f"{lo:,.1f}" if round(lo, 1) == round(hi, 1) else f"{lo:,.1f} to {hi:,.1f}"

    rows = []
    for category, group in comparison.groupby("category", sort=False):
        judged = [bool(a) for a in group["agrees"] if a is not None and not pd.isna(a)]
        if judged:
            agrees = f"{sum(judged)} of {plural(len(judged), 'GPU')}"
        else:
            agrees = "not comparable (see note)"
        rows.append(
            {
                "category": category,
                "predicted (GiB)": span(group["predicted_gib"]),
                "observed in the log (GiB)": span(group["observed_gib"]),
                "difference (GiB)": span(group["diff_gib"]),
                "agrees within tolerance": agrees,
            }
        )
    note = (
        "Ranges span the GPUs. Graph pools and free memory are not comparable on a GPU whose startup did not "
        "finish (capture stops at the failed allocation); 'short' is the whole capture's shortfall in the model "
        "and the failed allocation's in the log."
    )
    return table(rows, title="GPU memory budget: the memory model against the server log", note=note)


def mtp_bounds(
    hardware: HardwareProfile,
    concurrencies: Sequence[int],
    *,
    context_tokens: int,
    accept_length: float | None = None,
    tp: int = 8,
) -> Table:
    """The memory-bandwidth bound of a decode step with and without one MTP draft token, per level.

    With speculation every request sends two query tokens per step; the bound shows where that is nearly free
    (weights dominate) and where it doubles the dominant cost (the attention's KV reads).
    """
    from dsv4lab.model.roofline import decode_roofline

    accepted = accept_length if accept_length and accept_length > 1 else 1.7
    rows = []
    for c in concurrencies:
        plain = decode_roofline(hardware, tp=tp, concurrency=c, context_tokens=context_tokens)
        mtp = decode_roofline(
            hardware, tp=tp, concurrency=c, context_tokens=context_tokens, query_tokens=2, accepted_per_step=accepted
        )
        rows.append(
            {
                "concurrency": c,
                "bound without MTP (tok/s)": round(plain.tok_s, 1),
                "bound with MTP (tok/s)": round(mtp.tok_s, 1),
                "MTP gain at the bound": f"{mtp.tok_s / plain.tok_s - 1:+.0%}",
                "accepted tokens per step": round(accepted, 2),
            }
        )
    return table(rows, title="the memory-bandwidth bound of a decode step, with and without MTP")


def cheap_levers(config: ServerConfig) -> dict[str, tuple[str, ServerConfig]]:
    """Config A's cheap levers, each as (a name, the config without it): the A/Bs that measure them.

    FP8 autotuning is the tuned kernel-config folder; NCCL tuning the LL protocol and Ring algorithm in the
    environment; CUDA graphs the decode graphs SGLang captures. A lever the config already has off is left
    out: its A/B would compare the config with itself.
    """
    levers = {
        "fp8_gain": ("untuned-fp8", config.replace(kernel_config_dir=None)),
        "nccl_gain": ("nccl-defaults", config.with_values({"env.NCCL_PROTO": None, "env.NCCL_ALGO": None})),
        "cuda_graph_gain": ("no-cuda-graphs", config.replace(disable_cuda_graph=True)),
    }
    return {k: (name, without) for k, (name, without) in levers.items() if without != config}


def diagnosis_figures(d: Diagnosis) -> dict[str, Any]:
    """Where a server died, in the campaign's stable names (``oom_gpu``, ``short_by_gib``...)."""
    return {
        "outcome": d.outcome.value,
        "phase": d.phase.value if d.phase is not None else None,
        "oom_gpu": d.gpu,
        "tried_gib": d.tried_to_allocate_gib,
        "free_gib": d.free_gib,
        "total_gib": d.total_gib,
        "short_by_gib": d.figures.get("model_short_by_gib"),
        "confidence": d.confidence,
    }


def fix_figures(choice: FixCandidate) -> dict[str, Any]:
    """The chosen fix as flags, as the overrides the next notebooks apply, and what the model predicts."""
    return {
        "chosen_fix": choice.flags,
        "chosen_fix_overrides": overrides_text(choice.overrides),
        "chosen_fix_headroom_gib": choice.headroom_gib,
        "chosen_fix_kv_tokens": choice.kv_tokens,
    }


def gap_figures(kernels: Any, measured_tok_s: float, roofline: Any, goal_tok_s: float) -> dict[str, Any]:
    """The bottleneck and the distances: attention's share, measured vs the bandwidth bound vs the goal."""
    top, top_share = kernels.top()
    return {
        "attention_share": kernels.share("attention"),
        "top_kernel": top,
        "top_kernel_share": top_share,
        "measured_tok_s": measured_tok_s,
        "roofline_tok_s": roofline.tok_s,
        "goal_tok_s": goal_tok_s,
        "gap_to_goal": goal_tok_s / measured_tok_s,
        "gap_to_roofline": roofline.tok_s / measured_tok_s,
    }
