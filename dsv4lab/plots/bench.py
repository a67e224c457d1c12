"""Benchmark charts: A vs B throughput with confidence intervals, latency distributions, one run's requests,
and the gap between measured throughput, the bandwidth roofline and the goal.

Every axis is on the reader's clock (:mod:`dsv4lab.units`): the runs and comparisons already carry it, so a
chart of twin runs shows the modelled hardware and says so on its axis; no caller converts anything.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import altair as alt
import numpy as np
import pandas as pd

from dsv4lab.bench import ABComparison, BenchResult, t_quantile
from dsv4lab.bench.stats import metric_unit, metric_words
from dsv4lab.counts import plural
from dsv4lab.errors import PlotError
from dsv4lab.model.roofline import Roofline
from dsv4lab.plots.theme import CONFIG_COLORS, OKABE_ITO, WIDTH
from dsv4lab.units import REAL, Clock, fmt_ms

__all__ = ["axis_title", "latency_distributions", "request_timeline", "roofline_gap", "throughput_vs_concurrency"]

#: The throughput axis's title for a real server's figures.
MEASURED = "output throughput (tok/s)"
#: The throughput axis's title for twin figures converted to the modelled hardware, so a chart says which.
MODELLED = "output throughput (tok/s, modelled hardware)"

_VERDICT_WORDS = {"better": "better", "worse": "worse", "no detectable difference": "no detectable difference"}


def _clock(runs: Sequence[BenchResult]) -> Clock:
    """The runs' common clock (a chart of runs on different clocks cannot label its axis)."""
    clocks = {r.clock for r in runs}
    if len(clocks) > 1:
        raise PlotError("the runs were measured on different clocks (a twin's and a real server's); draw them apart")
    return clocks.pop()


def axis_title(what: str, unit: str, clock: Clock) -> str:
    """``"time to first token (ms, modelled hardware)"``: the quantity, its unit, and on the twin its clock."""
    return f"{what} ({unit}, {clock.reading})" if clock.is_twin else f"{what} ({unit})"


def _ci_half(sd: float, n: int, confidence: float = 0.95) -> float:
    if n < 2 or not math.isfinite(sd):
        return 0.0
    return t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)


def throughput_vs_concurrency(
    comparison: ABComparison,
    *,
    labels: tuple[str, str] | None = None,
    units: str | None = None,
    title: str | Sequence[str] | None = None,
) -> alt.LayerChart:
    """Mean throughput of each config per concurrency level with its 95 % CI, and B − A's verdict; the
    axis says the metric, its unit and (twin) the modelled hardware. ``labels`` default to the comparison's.

    The bars are each arm's own interval (Student t over its repeats); the verdict above each level is the
    Welch interval of the difference from :func:`dsv4lab.bench.compare`, which is what decides.
    """
    if not comparison.levels:
        raise PlotError("the comparison has no concurrency levels")
    labels = labels or (comparison.label_a, comparison.label_b)
    clock = comparison.clock or REAL
    words = metric_words(comparison.metric).rsplit(" (", 1)[0]
    units = units or axis_title(words, metric_unit(comparison.metric) or "value", clock)
    data, note = _throughput_frames(comparison, labels)
    levels = list(dict.fromkeys(data["concurrency"]))
    chart_out: alt.LayerChart = alt.layer(*_throughput_layers(data, note, labels, levels, units)).properties(
        width=max(420, 230 * len(levels)),
        height=320,
        title=alt.Title(
            _throughput_title(comparison, labels)
            if title is None
            else title
            if isinstance(title, str)
            else list(title),
            subtitle=_throughput_subtitle(comparison, labels, clock),
        ),
    )
    return chart_out


def _throughput_frames(comparison: ABComparison, labels: tuple[str, str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Each arm's mean and 95 % interval per level (the bars), and each level's verdict (the notes above)."""
    rows = []
    notes = []
    for lv in comparison.levels:
        c = "all" if lv.concurrency is None else str(lv.concurrency)
        for arm, mean, sd, n in ((labels[0], lv.mean_a, lv.sd_a, lv.n_a), (labels[1], lv.mean_b, lv.sd_b, lv.n_b)):
            half = _ci_half(sd, n)
            rows.append(
                {"concurrency": c, "config": arm, "mean": mean, "low": mean - half, "high": mean + half, "n": n}
            )
        lo, hi = lv.rel_ci
        notes.append(
            {
                "concurrency": c,
                "top": max(lv.mean_a, lv.mean_b) + max(_ci_half(lv.sd_a, lv.n_a), _ci_half(lv.sd_b, lv.n_b)),
                "line1": f"{lv.rel_diff:+.0%} (95% CI {lo:+.0%} to {hi:+.0%})",
                "line2": _VERDICT_WORDS[lv.verdict],
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(notes)


def _throughput_layers(
    data: pd.DataFrame, note: pd.DataFrame, labels: tuple[str, str], levels: list[str], units: str
) -> list[alt.Chart]:
    """Bars side by side per level with their error bars and values; the verdict's two lines above."""
    y_top = float(max(data["high"].max(), note["top"].max())) * 1.28
    x = alt.X("concurrency:N", title="concurrency (requests in flight)", sort=levels, axis=alt.Axis(labelAngle=0))
    y = alt.Y("mean:Q", title=units, scale=alt.Scale(domain=[0, y_top], nice=False))
    color = alt.Color("config:N", title="config", scale=alt.Scale(domain=list(labels), range=list(CONFIG_COLORS[:2])))
    offset = alt.XOffset("config:N", sort=list(labels), scale=alt.Scale(paddingOuter=0.6))
    base = alt.Chart(data)
    bars = base.mark_bar(opacity=0.85, width=alt.RelativeBandSize(0.8)).encode(
        x=x,
        xOffset=offset,
        y=y,
        color=color,
        tooltip=[
            alt.Tooltip("config:N"),
            alt.Tooltip("concurrency:N"),
            alt.Tooltip("mean:Q", format=",.1f"),
            alt.Tooltip("low:Q", format=",.1f", title="95% CI low"),
            alt.Tooltip("high:Q", format=",.1f", title="95% CI high"),
            alt.Tooltip("n:Q", title="repeats"),
        ],
    )
    errors = base.mark_rule(color="#222222", strokeWidth=1.5).encode(x=x, xOffset=offset, y="low:Q", y2="high:Q")
    values = base.mark_text(dy=-8, baseline="bottom", fontSize=11, color="#222222").encode(
        x=x, xOffset=offset, y=alt.Y("high:Q"), text=alt.Text("mean:Q", format=",.1f")
    )
    text1 = (
        alt.Chart(note)
        .mark_text(dy=-40, baseline="bottom", fontSize=12, fontWeight="bold", color="#222222")
        .encode(x=x, y=alt.Y("top:Q"), text="line1:N")
    )
    text2 = (
        alt.Chart(note)
        .mark_text(dy=-24, baseline="bottom", fontSize=11, color="#444444")
        .encode(x=x, y=alt.Y("top:Q"), text="line2:N")
    )
    return [bars, errors, values, text1, text2]


def _throughput_title(comparison: ABComparison, labels: tuple[str, str]) -> str:
    parts = [
        f"{lv.rel_diff:+.0%} at concurrency {lv.concurrency}"
        if lv.verdict != "no detectable difference"
        else f"no detectable difference at {lv.concurrency}"
        for lv in comparison.levels
    ]
    return f"{labels[1]} vs {labels[0]}: " + ", ".join(parts)


def _throughput_subtitle(comparison: ABComparison, labels: tuple[str, str], clock: Clock) -> list[str]:
    n = min(min(lv.n_a, lv.n_b) for lv in comparison.levels)
    subtitle = [
        f"bars: mean of {n}+ repeats per config and level; error bars: the 95% CI of each mean",
        f"above: {labels[1]} vs {labels[0]}, Welch 95% CI of the difference and its verdict",
    ]
    if comparison.workload:
        subtitle.append(f"workload: {comparison.workload}")
    if clock.is_twin:
        subtitle.append(clock.caption)
    return subtitle


# -- latency -------------------------------------------------------------------------------------------------------


def _label(r: BenchResult, i: int) -> str:
    base = r.label or f"run {i + 1}"
    c = "∞" if r.concurrency is None else str(r.concurrency)
    return f"{base} · C={c}" + (f" · #{r.repeat + 1}" if r.repeat else "")


def _quantiles(values: np.ndarray) -> dict[str, float]:
    q = np.percentile(values, [5, 25, 50, 75, 95])
    return {"p5": q[0], "p25": q[1], "p50": q[2], "p75": q[3], "p95": q[4], "n": float(values.size)}


def latency_distributions(
    results: BenchResult | Sequence[BenchResult],
    *,
    title: str | Sequence[str] | None = None,
) -> alt.HConcatChart:
    """Time to first token and inter-token latency per run: box from p25 to p75, median tick, whiskers
    p5-p95, on the runs' reading clock (the modelled hardware for twin runs)."""
    runs = [results] if isinstance(results, BenchResult) else list(results)
    if not runs:
        raise PlotError("no benchmark results to draw")
    clock = _clock(runs)
    ttft_title = axis_title("time to first token", "ms", clock)
    itl_title = axis_title("inter-token latency", "ms", clock)
    rows = []
    for i, r in enumerate(runs):
        ok = r.requests[r.requests["status"] == "ok"] if "status" in r.requests else r.requests
        ttft: np.ndarray[Any, Any] = ok["ttft_ms"].dropna().to_numpy(dtype=float)
        itl_lists = [v for v in ok["itl_ms"] if isinstance(v, (list, tuple)) and v]
        itl: np.ndarray[Any, Any] = np.asarray([g for lst in itl_lists for g in lst], dtype=float)
        for metric, values in ((ttft_title, ttft), (itl_title, itl)):
            if values.size:
                rows.append({"run": _label(r, i), "metric": metric, **_quantiles(values)})
    if not rows:
        raise PlotError("the results hold no completed requests")
    data = pd.DataFrame(rows)
    order = list(dict.fromkeys(data["run"]))
    panels = []
    for metric in (ttft_title, itl_title):
        d = data[data["metric"] == metric]
        if d.empty:
            continue
        top = float(d["p95"].max()) * 1.08
        x_scale = alt.Scale(domain=[0, top], nice=True)
        y = alt.Y("run:N", title=None, sort=order, axis=alt.Axis(labelLimit=240))
        base = alt.Chart(d)
        whisker = base.mark_rule(color="#555555").encode(x=alt.X("p5:Q", title=metric, scale=x_scale), x2="p95:Q", y=y)
        box = base.mark_bar(height=16, color=OKABE_ITO["sky"], stroke="#333333", strokeWidth=0.6).encode(
            x=alt.X("p25:Q", scale=x_scale), x2="p75:Q", y=y
        )
        median = base.mark_tick(color="#000000", thickness=2.5, size=22).encode(
            x=alt.X("p50:Q", scale=x_scale),
            y=y,
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("p5:Q", format=",.1f"),
                alt.Tooltip("p25:Q", format=",.1f"),
                alt.Tooltip("p50:Q", format=",.1f", title="median"),
                alt.Tooltip("p75:Q", format=",.1f"),
                alt.Tooltip("p95:Q", format=",.1f"),
                alt.Tooltip("n:Q", title="values"),
            ],
        )
        label = base.mark_text(align="left", dx=6, fontSize=11, color="#222222").encode(
            x=alt.X("p95:Q", scale=x_scale), y=y, text=alt.Text("p50:Q", format=",.0f")
        )
        panels.append(alt.layer(whisker, box, median, label).properties(width=300, height=max(60, 34 * len(order))))
    if title is None:
        first = data[data["run"] == order[0]].set_index("metric")
        ttft_med = first.loc[ttft_title, "p50"] if ttft_title in first.index else math.nan
        itl_med = first.loc[itl_title, "p50"] if itl_title in first.index else math.nan
        title = (
            f"{order[0]}: median time to first token {ttft_med:,.0f} ms, inter-token {itl_med:,.0f} ms"
            if len(order) == 1
            else "Time to first token and inter-token latency per run"
        )
    subtitle = "box: 25th-75th percentile, black tick and number: median (ms), whiskers: 5th-95th percentile"
    if clock.is_twin:
        subtitle += f"; {clock.caption}"
    chart_out: alt.HConcatChart = alt.hconcat(*panels, spacing=30).properties(
        title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle)
    )
    return chart_out


#: A request's parts in the legend's order, with their colours.
_REQUEST_PARTS = {
    "queued for a slot": "#BBBBBB",
    "waiting for first token": OKABE_ITO["orange"],
    "decoding": OKABE_ITO["blue"],
    "failed": OKABE_ITO["vermillion"],
    "incomplete": OKABE_ITO["purple"],
}


def request_timeline(
    result: BenchResult,
    *,
    max_requests: int = 1200,
    title: str | Sequence[str] | None = None,
) -> alt.LayerChart:
    """Every request of one run as a bar: queued for a slot, waiting for its first token, decoding.

    Shows at a glance whether requests overlapped as intended, where prefill (the wait for the first
    token) dominates, and stragglers. Runs with more than ``max_requests`` are thinned evenly. Times are on
    the run's reading clock (the modelled hardware for a twin run).
    """
    clock = result.clock
    df = result.requests
    if df.empty:
        raise PlotError("the result has no requests")
    d = df[df["start_s"].notna()].sort_values("start_s").reset_index(drop=True)
    if d.empty:
        raise PlotError("no request of this run was sent")
    shown = d
    if len(d) > max_requests:
        shown = d.iloc[np.linspace(0, len(d) - 1, max_requests).round().astype(int)].reset_index(drop=True)
    data = _request_parts(shown)
    n = len(shown)
    bar_px = max(1.0, min(10.0, 360 / max(n, 1)))
    chart_out: alt.LayerChart = alt.layer(_request_bars(data, n, bar_px, clock)).properties(
        width=WIDTH,
        height=max(120, min(420, n * (bar_px + 1))),
        title=alt.Title(
            _request_title(result) if title is None else title if isinstance(title, str) else list(title),
            subtitle=_request_subtitle(result, len(d), n),
        ),
    )
    return chart_out


def _request_parts(shown: pd.DataFrame) -> pd.DataFrame:
    """One row per part of each request (from, to on the reading clock): queued, first token, decoding; a
    request that failed without a first token is one bar of its status."""
    rows = []
    requests: Iterable[Any] = shown.itertuples()  # one namedtuple per request, fields as the frame's columns
    for order, r in enumerate(requests):
        start = float(r.start_s)
        sched = float(r.scheduled_s)
        ttft = None if pd.isna(r.ttft_ms) else float(r.ttft_ms) / 1000
        e2e = None if pd.isna(r.e2e_ms) else float(r.e2e_ms) / 1000
        idx = int(r.index)
        if start - sched > 1e-3:
            rows.append({"request": order, "id": idx, "part": "queued for a slot", "from": sched, "to": start})
        if ttft is not None:
            rows.append(
                {"request": order, "id": idx, "part": "waiting for first token", "from": start, "to": start + ttft}
            )
            if e2e is not None:
                rows.append({"request": order, "id": idx, "part": "decoding", "from": start + ttft, "to": start + e2e})
        elif r.status != "ok":
            rows.append(
                {"request": order, "id": idx, "part": f"{r.status}", "from": start, "to": start + (e2e or 0.01)}
            )
    data: pd.DataFrame = pd.DataFrame(rows)
    return data


def _request_bars(data: pd.DataFrame, n: int, bar_px: float, clock: Clock) -> alt.Chart:
    present = [p for p in _REQUEST_PARTS if p in set(data["part"])]
    chart: alt.Chart = (
        alt.Chart(data)
        .mark_bar(height=bar_px)
        .encode(
            x=alt.X("from:Q", title=axis_title("time since the run started", "s", clock)),
            x2="to:Q",
            y=alt.Y(
                "request:O", title=f"request (by send time), {n} shown", axis=alt.Axis(labels=n <= 40, ticks=n <= 40)
            ),
            color=alt.Color(
                "part:N", title=None, scale=alt.Scale(domain=present, range=[_REQUEST_PARTS[p] for p in present])
            ),
            tooltip=[
                alt.Tooltip("id:Q", title="request"),
                alt.Tooltip("part:N"),
                alt.Tooltip("from:Q", format=".2f"),
                alt.Tooltip("to:Q", format=".2f"),
            ],
        )
    )
    return chart


def _request_title(result: BenchResult) -> str:
    s = result.on_hardware
    c = "unlimited" if result.concurrency is None else str(result.concurrency)
    return f"{result.label or 'Run'}: {s.completed} of {plural(s.total, 'request')} at concurrency {c}"


def _request_subtitle(result: BenchResult, sent: int, shown: int) -> str:
    s, clock = result.on_hardware, result.clock
    subtitle = f"median time to first token {fmt_ms(s.ttft_ms.median)}, end to end {fmt_ms(s.e2e_ms.median)}"
    if sent > shown:
        subtitle += f"; every {sent / shown:.1f}th of {plural(sent, 'request')} shown"
    if clock.is_twin:
        subtitle += f"; {clock.caption}"
    return subtitle


# -- the gap ------------------------------------------------------------------------------------------------------


def roofline_gap(
    measured: Mapping[str, float] | Sequence[tuple[str, float]],
    roofline: Roofline | Sequence[Roofline] | None = None,
    *,
    target_tok_s: float = 1000.0,
    clock: Clock | None = None,
    title: str | Sequence[str] | None = None,
) -> alt.LayerChart:
    """Throughput per config (already on the reader's clock, e.g. from ``findings.throughput_figures``)
    against the hardware's bandwidth roofline and the goal, on a log axis (the distances are ratios: 23 vs
    1,000 is 43x). ``clock`` says which clock the figures are on (the axis names it)."""
    clock = clock or Clock()
    units = axis_title("output throughput", "tok/s", clock)
    items = list(measured.items()) if isinstance(measured, Mapping) else list(measured)
    if not items:
        raise PlotError("no measured throughput to compare")
    bounds = [] if roofline is None else ([roofline] if isinstance(roofline, Roofline) else list(roofline))
    rows: list[dict[str, Any]] = [{"what": k, "tok_s": float(v), "kind": "measured"} for k, v in items]
    for b in bounds:
        rows.append({"what": f"roofline, C={b.concurrency}", "tok_s": b.tok_s, "kind": "roofline (memory bandwidth)"})
    data = pd.DataFrame(rows)
    data["text"] = [f"{v:,.0f}" if v >= 100 else f"{v:,.1f}" for v in data["tok_s"]]
    order = list(data["what"])
    lo = float(min(data["tok_s"].min(), target_tok_s)) / 3
    hi = float(max(data["tok_s"].max(), target_tok_s)) * 4
    x_scale = alt.Scale(type="log", domain=[lo, hi], nice=False)
    # 1-3-10 ticks: Vega's own log ticks put 2,000 and 3,000 on top of each other near the right end.
    ticks = [m * 10**e for e in range(-2, 9) for m in (1, 3) if lo <= m * 10**e <= hi]
    drawn = set(data["kind"])  # the legend lists what is drawn: no roofline entry without its bars
    palette = {"measured": OKABE_ITO["blue"], "roofline (memory bandwidth)": "#999999"}
    kinds = [k for k in palette if k in drawn]
    bars = (
        alt.Chart(data)
        .mark_bar(height=22)
        .encode(
            x=alt.X("tok_s:Q", title=f"{units} (log scale)", scale=x_scale, axis=alt.Axis(values=ticks)),
            x2=alt.datum(lo),
            y=alt.Y("what:N", title=None, sort=order, axis=alt.Axis(labelLimit=320)),
            color=alt.Color("kind:N", title=None, scale=alt.Scale(domain=kinds, range=[palette[k] for k in kinds])),
            tooltip=[alt.Tooltip("what:N"), alt.Tooltip("tok_s:Q", format=",.1f")],
        )
    )
    values = (  # inside the bar's end: a label beside it could sit under the goal line
        alt.Chart(data)
        .mark_text(align="right", dx=-6, fontSize=12, fontWeight="bold", color="white")
        .encode(x=alt.X("tok_s:Q", scale=x_scale), y=alt.Y("what:N", sort=order), text="text:N")
    )
    goal = pd.DataFrame([{"x": target_tok_s, "label": f"goal {target_tok_s:,.0f} tok/s"}])
    rule = (
        alt.Chart(goal)
        .mark_rule(color=OKABE_ITO["vermillion"], strokeWidth=2, strokeDash=[6, 3])
        .encode(x=alt.X("x:Q", scale=x_scale))
    )
    rule_text = (
        alt.Chart(goal)
        .mark_text(
            align="left", baseline="top", dx=4, dy=-18, fontSize=12, fontWeight="bold", color=OKABE_ITO["vermillion"]
        )
        .encode(x=alt.X("x:Q", scale=x_scale), y=alt.value(0), text="label:N")
    )
    best_name, best = max(items, key=lambda kv: kv[1])
    if title is None:
        gap = target_tok_s / best
        title = f"{best_name}: {best:,.1f} tok/s, {gap:,.0f}x below the {target_tok_s:,.0f} tok/s goal"
    subtitle: list[str] = []
    if bounds:  # the roofline is explained where it is drawn
        b = max(bounds, key=lambda r: r.tok_s)
        subtitle.append(
            "roofline: weights, touched experts and KV cache read once per decode step at full memory bandwidth"
            f" ({b.hardware}, {b.model}, TP{b.tp}, {b.context_tokens:,}-token context)"
        )
        subtitle.append(f"{best_name} reaches {best / b.tok_s:.1%} of the highest bound")
    if clock.is_twin:
        subtitle.append(clock.caption)
    chart_out: alt.LayerChart = alt.layer(bars, values, rule, rule_text).properties(
        width=WIDTH,
        height=max(120, 44 * len(order)),
        title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle or alt.Undefined),
    )
    return chart_out
