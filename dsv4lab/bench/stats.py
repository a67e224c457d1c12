"""A/B verdicts: is B better than A at this concurrency, by how much, and how sure are we?

Per concurrency level the repeats of each arm give a mean and a sample variance of one metric (output
tok/s by default). The difference B − A gets a Welch 95 % confidence interval (unequal variances,
Welch–Satterthwaite degrees of freedom), and the verdict follows the interval: **better** when it lies
entirely on the good side of zero, **worse** when entirely on the bad side, otherwise **no detectable
difference** — an interval that touches zero exactly is not evidence of a difference. At least three
repeats per arm are required: with two, the t quantile is so large that almost nothing is detectable,
and with one there is no variance at all.

scipy is not a dependency, so the t quantile is computed here: the Student t CDF through the regularised
incomplete beta function (its continued fraction, evaluated with the modified Lentz method), inverted by
bisection. It matches published tables to better than 1e-9.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from dsv4lab.bench.results import BenchResult
from dsv4lab.errors import BenchError, unknown_name_message
from dsv4lab.units import Clock

__all__ = ["ABComparison", "ABLevel", "ABVerdict", "compare", "metric_value", "t_quantile", "verdict_for", "welch"]

#: What an A/B concludes about B against A (the readiness verdict is :class:`dsv4lab.serving.watch.Verdict`).
ABVerdict = Literal["better", "worse", "no detectable difference"]

#: Metrics where lower is better; anything else (throughputs, goodput) is higher-is-better.
_LOWER_IS_BETTER_PREFIXES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "duration_s")

MIN_REPEATS = 3


# -- Student t quantile ----------------------------------------------------------------------------------------


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` (possibly fractional) degrees of freedom."""
    if math.isinf(df):
        return 0.5 * math.erfc(-t / math.sqrt(2.0))
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` > 0 degrees of freedom (e.g. 0.975 for a 95 % CI)."""
    if not 0.0 < p < 1.0:
        raise BenchError(f"quantile probability must be in (0, 1), got {p}")
    if not df > 0:
        raise BenchError(f"degrees of freedom must be > 0, got {df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# -- Welch ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WelchResult:
    diff: float  # mean(b) - mean(a)
    se: float
    df: float
    t_crit: float
    ci_low: float
    ci_high: float


def welch(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95) -> WelchResult:
    """Welch's confidence interval for mean(b) − mean(a)."""
    if len(a) < 2 or len(b) < 2:
        raise BenchError("each arm needs at least two values for a variance")
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a), statistics.variance(b)
    qa, qb = va / len(a), vb / len(b)
    se = math.sqrt(qa + qb)
    diff = mb - ma
    if se == 0.0:  # both arms constant: the difference is known exactly
        return WelchResult(diff, 0.0, math.inf, 0.0, diff, diff)
    df = (qa + qb) ** 2 / ((qa * qa / (len(a) - 1) if qa else 0.0) + (qb * qb / (len(b) - 1) if qb else 0.0))
    t_crit = t_quantile(0.5 + confidence / 2.0, df)
    return WelchResult(diff, se, df, t_crit, diff - t_crit * se, diff + t_crit * se)


def verdict_for(ci_low: float, ci_high: float, *, higher_is_better: bool) -> ABVerdict:
    """The verdict an interval for B − A supports; touching zero is not a difference."""
    if ci_low > 0.0:
        return "better" if higher_is_better else "worse"
    if ci_high < 0.0:
        return "worse" if higher_is_better else "better"
    return "no detectable difference"


# -- comparing runs ------------------------------------------------------------------------------------------


def metric_value(result: BenchResult, metric: str) -> float:
    """``"output_throughput"`` or a distribution statistic such as ``"ttft_ms.median"`` of one result, on the
    reader's clock (the modelled hardware on the twin: :attr:`BenchResult.on_hardware`)."""
    name, _, stat = metric.partition(".")
    value: Any = getattr(result.on_hardware, name, None)
    if value is None:
        raise BenchError(unknown_name_message("metric", name, [f.name for f in dataclasses.fields(result.summary)]))
    if stat:
        known = [f.name for f in dataclasses.fields(value)] if dataclasses.is_dataclass(value) else []
        value = getattr(value, stat, None)
        if value is None:
            raise BenchError(unknown_name_message("statistic", stat, known, where=f" in metric {metric!r}"))
    if not isinstance(value, (int, float)):
        raise BenchError(f"metric {metric!r} is not a number (give a statistic, e.g. {metric}.median)")
    return float(value)


@dataclass(frozen=True)
class ABLevel:
    """The comparison at one concurrency level."""

    concurrency: int | None
    metric: str
    n_a: int
    n_b: int
    mean_a: float
    mean_b: float
    sd_a: float
    sd_b: float
    diff: float
    ci_low: float
    ci_high: float
    df: float
    verdict: ABVerdict

    @property
    def rel_diff(self) -> float:
        """(B − A) / A, e.g. 0.47 for +47 %."""
        return self.diff / self.mean_a if self.mean_a else math.nan

    @property
    def rel_ci(self) -> tuple[float, float]:
        """The CI relative to A's mean (A's mean taken as exact: a reading aid, not a ratio CI)."""
        if not self.mean_a:
            return (math.nan, math.nan)
        return (self.ci_low / self.mean_a, self.ci_high / self.mean_a)

    def sentence(self) -> str:
        lo, hi = self.rel_ci
        return (
            f"concurrency {self.concurrency}: B − A = {self.diff:+.4g} {self.metric} ({self.rel_diff:+.1%}, "
            f"95% CI {lo:+.1%} to {hi:+.1%}; n = {self.n_a}/{self.n_b}) → {self.verdict}"
        )


@dataclass(frozen=True)
class ABComparison:
    """Per-level comparisons of B against A."""

    metric: str
    higher_is_better: bool
    levels: tuple[ABLevel, ...]
    label_a: str = "A"
    label_b: str = "B"
    #: The clock both arms' figures are on (None when they differ): on the twin, the modelled hardware's.
    clock: Clock | None = None
    #: The workload both arms ran ("8,000 in / 64 out tokens per request"), empty when they differ: a
    #: throughput means little without it (the same server does 15 tok/s on short outputs, 20 on long).
    workload: str = ""

    def at(self, concurrency: int | None) -> ABLevel:
        for level in self.levels:
            if level.concurrency == concurrency:
                return level
        raise BenchError(f"no comparison at concurrency {concurrency}")

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for lv in self.levels:
            lo, hi = lv.rel_ci
            rows.append(
                {
                    "concurrency": lv.concurrency,
                    "label_a": self.label_a,
                    "label_b": self.label_b,
                    "metric": self.metric,
                    "n_a": lv.n_a,
                    "n_b": lv.n_b,
                    "mean_a": lv.mean_a,
                    "mean_b": lv.mean_b,
                    "diff": lv.diff,
                    "rel_diff": lv.rel_diff,
                    "ci_low": lv.ci_low,
                    "ci_high": lv.ci_high,
                    "rel_ci_low": lo,
                    "rel_ci_high": hi,
                    "verdict": lv.verdict,
                    "clock": self.clock.kind if self.clock is not None else None,
                }
            )
        frame: pd.DataFrame = pd.DataFrame(rows)
        return frame

    def __str__(self) -> str:
        return "\n".join(level.sentence() for level in self.levels)

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        states: dict[str, hv.State] = {"better": "ok", "worse": "fail", "no detectable difference": "info"}
        unit = metric_unit(self.metric)
        rows = [
            {
                "concurrency": lv.concurrency,
                f"{self.label_a} mean ({unit})": lv.mean_a,
                f"{self.label_b} mean ({unit})": lv.mean_b,
                "B − A": f"{lv.rel_diff:+.1%}",
                "95% CI": f"{lv.rel_ci[0]:+.1%} … {lv.rel_ci[1]:+.1%}",
                "repeats": f"{lv.n_a}/{lv.n_b}",
                "verdict": hv.raw(hv.badge(lv.verdict, states[lv.verdict])),
            }
            for lv in self.levels
        ]
        better = "higher" if self.higher_is_better else "lower"
        workload = f"; {self.workload}" if self.workload else ""
        head = hv.p(
            f"{self.label_b} vs {self.label_a} on {metric_words(self.metric)} ({better} is better), "
            f"Welch 95% CI{workload}"
        )
        note = hv.p(self.clock.note()) if self.clock is not None and self.clock.is_twin else ""
        return hv.card(f"A/B: {self.label_b} vs {self.label_a}", head + hv.table(rows, digits=1) + note)


def metric_unit(metric: str) -> str:
    """The unit of a comparable metric: ``output_throughput`` -> ``tok/s``, ``ttft_ms.median`` -> ``ms``."""
    name = metric.partition(".")[0]
    if name.endswith("_ms"):
        return "ms"
    if name == "request_throughput" or name == "goodput":
        return "req/s"
    if name.endswith("throughput"):
        return "tok/s"
    if name == "duration_s":
        return "s"
    return "count" if name in ("completed", "failed", "total_output_tokens", "total_input_tokens") else ""


def metric_words(metric: str) -> str:
    """A metric as a reader says it: ``output_throughput`` -> ``output throughput (tok/s)``."""
    name, _, stat = metric.partition(".")
    words = name.removesuffix("_ms").replace("_", " ")
    words = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "end-to-end latency"}.get(words, words)
    unit = metric_unit(metric)
    return f"{stat + ' ' if stat else ''}{words}" + (f" ({unit})" if unit else "")


def compare(
    a_runs: Sequence[BenchResult],
    b_runs: Sequence[BenchResult],
    *,
    metric: str = "output_throughput",
    higher_is_better: bool | None = None,
    confidence: float = 0.95,
    min_repeats: int = MIN_REPEATS,
    allow_partial: bool = False,
    label_a: str | None = None,
    label_b: str | None = None,
) -> ABComparison:
    """Compare B against A at every concurrency level both arms have.

    Partial runs (the server died) are left out unless ``allow_partial``; a level with fewer than
    ``min_repeats`` usable runs in either arm raises :class:`BenchError` naming it.
    """
    if min_repeats < 2:
        raise BenchError("min_repeats must be >= 2 (a variance needs two values)")
    hib = higher_is_better if higher_is_better is not None else not metric.startswith(_LOWER_IS_BETTER_PREFIXES)

    def by_level(runs: Sequence[BenchResult]) -> dict[int | None, list[float]]:
        out: dict[int | None, list[float]] = {}
        for r in runs:
            if r.partial and not allow_partial:
                continue
            value = metric_value(r, metric)
            if not math.isnan(value):
                out.setdefault(r.concurrency, []).append(value)
        return out

    a, b = by_level(a_runs), by_level(b_runs)
    levels = [c for c in a if c in b]
    if not levels:
        raise BenchError(
            f"A and B have no concurrency level in common (A: {sorted(map(str, a))}, B: {sorted(map(str, b))})"
        )
    out: list[ABLevel] = []
    for c in sorted(levels, key=lambda x: -1 if x is None else x):
        va, vb = a[c], b[c]
        if len(va) < min_repeats or len(vb) < min_repeats:
            raise BenchError(
                f"concurrency {c}: A has {len(va)} and B {len(vb)} usable repeats; at least {min_repeats} per arm "
                "are needed for a confidence interval"
            )
        w = welch(va, vb, confidence=confidence)
        out.append(
            ABLevel(
                concurrency=c,
                metric=metric,
                n_a=len(va),
                n_b=len(vb),
                mean_a=statistics.fmean(va),
                mean_b=statistics.fmean(vb),
                sd_a=statistics.stdev(va),
                sd_b=statistics.stdev(vb),
                diff=w.diff,
                ci_low=w.ci_low,
                ci_high=w.ci_high,
                df=w.df,
                verdict=verdict_for(w.ci_low, w.ci_high, higher_is_better=hib),
            )
        )
    clocks = {r.clock for r in (*a_runs, *b_runs)}
    return ABComparison(
        metric,
        hib,
        tuple(out),
        label_a or _common_label(a_runs, "A"),
        label_b or _common_label(b_runs, "B"),
        clocks.pop() if len(clocks) == 1 else None,
        _common_workload((*a_runs, *b_runs)),
    )


def _common_workload(runs: Sequence[BenchResult]) -> str:
    described = {r.workload_text for r in runs}
    return described.pop() if len(described) == 1 else ""


def _common_label(runs: Sequence[BenchResult], default: str) -> str:
    labels = {r.label for r in runs if r.label}
    return labels.pop() if len(labels) == 1 else default
