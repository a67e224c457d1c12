"""Charts of what the server itself reports: its decode-batch statistics over time, and where GPU time goes."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Sequence

import altair as alt
import pandas as pd

from dsv4lab.counts import plural
from dsv4lab.errors import PlotError
from dsv4lab.logs import DecodeBatch, Event
from dsv4lab.logs.source import LogSource
from dsv4lab.model.budget import event_time, log_events
from dsv4lab.plots.theme import KIND_COLORS, OKABE_ITO, WIDTH
from dsv4lab.serving.profiling import KernelBreakdown
from dsv4lab.units import REAL, Clock, fmt_ms

__all__ = ["decode_stats", "kernel_breakdown"]

MAX_POINTS = 5000

_PANELS = (
    ("gen_throughput", "tok/s generated", OKABE_ITO["blue"]),
    ("accept_len", "accepted / step", OKABE_ITO["orange"]),
    ("token_usage_pct", "KV pool used (%)", OKABE_ITO["green"]),
    ("running", "running requests", OKABE_ITO["purple"]),
)


def _decode_rows(log: LogSource | Iterable[Event], tz: _dt.tzinfo | None) -> pd.DataFrame:
    rows = []
    for ev in log_events(log):
        if not isinstance(ev, DecodeBatch):
            continue
        when = event_time(ev, tz)
        if when is None:
            continue
        rows.append(
            {
                "time": when,
                "gen_throughput": ev.gen_throughput,
                "accept_len": ev.accept_len,
                "token_usage_pct": None if ev.token_usage is None else ev.token_usage * 100,
                "running": ev.running,
            }
        )
    frame: pd.DataFrame = pd.DataFrame(
        rows, columns=["time", "gen_throughput", "accept_len", "token_usage_pct", "running"]
    )
    return frame


def decode_stats(
    log: LogSource | Iterable[Event],
    *,
    tz: _dt.tzinfo | None = None,
    clock: Clock | None = None,
    config: str = "",
    title: str | Sequence[str] | None = None,
) -> alt.VConcatChart:
    """Generation throughput, accept length (speculative decoding only), KV-pool use and running requests
    from the server's ``Decode batch`` lines, stacked on one time axis.

    ``clock`` is the server's: a twin's log is drawn on the modelled hardware (throughput and time axis
    converted, the axes say so). Long logs are averaged into time buckets so that the chart stays under
    5,000 points.
    """
    df = _decode_rows(log, tz)
    if df.empty:
        raise PlotError("the log has no decode-batch lines (was the server benchmarked? is --decode-log-interval set?)")
    t0 = df["time"].iloc[0]
    clock = clock or REAL
    df["t"] = [(t - t0).total_seconds() for t in df["time"]]
    df["gen_throughput"] = [float(v) for v in df["gen_throughput"]]
    panels_present = [p for p in _PANELS if df[p[0]].notna().any()]
    limit = MAX_POINTS // max(1, len(panels_present))
    if len(df) > limit:
        span = float(df["t"].max()) or 1.0
        width = span / (limit - 1)  # floor() can make one bucket more than span / width
        df = df.assign(t=(df["t"] // width) * width).groupby("t", as_index=False).mean(numeric_only=True)
    charts = []
    for i, (col, label, color) in enumerate(panels_present):
        d = df[["t", col]].dropna()
        last = i == len(panels_present) - 1
        x = alt.X(
            "t:Q",
            title=("time since the first decode batch (s" + (", modelled hardware)" if clock.is_twin else ")"))
            if last
            else None,
            axis=alt.Axis(labels=last, ticks=last),
            scale=alt.Scale(domain=[0, float(df["t"].max()) or 1.0], nice=False),
        )
        charts.append(
            alt.Chart(d)
            # Each line covers the interval before it (SGLang averages since its previous line): step-before.
            .mark_line(
                color=color,
                interpolate="step-before",
                point=alt.OverlayMarkDef(color=color, size=18) if len(d) <= 80 else False,
            )
            .encode(
                x=x,
                y=alt.Y(f"{col}:Q", title=label, scale=alt.Scale(zero=True)),
                tooltip=[
                    alt.Tooltip("t:Q", format=".1f", title="s"),
                    alt.Tooltip(f"{col}:Q", format=",.2f", title=label),
                ],
            )
            .properties(width=WIDTH, height=120)
        )
    gen = df["gen_throughput"].dropna()
    acc = df["accept_len"].dropna()
    if title is None:
        what = f"{config}: " if config else "Decode batches: "
        title = what + f"median generation {gen.median():,.1f} tok/s" if len(gen) else what.rstrip(": ")
        if len(acc):
            title += f", {acc.mean():.2f} tokens accepted per step"
    subtitle = f"from the server log's Decode batch lines ({plural(len(df), 'point')})"
    if clock.is_twin:
        subtitle += "; twin run: the log's times and rates are the modelled hardware's"
    chart_out: alt.VConcatChart = alt.vconcat(*charts, spacing=6).properties(
        title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle)
    )
    return chart_out


def _short(name: str, limit: int = 46) -> str:
    return name if len(name) <= limit else name[: limit - 1] + "…"


def kernel_breakdown(
    breakdown: KernelBreakdown,
    *,
    top: int = 8,
    title: str | Sequence[str] | None = None,
) -> alt.HConcatChart:
    """GPU time by kernel kind (left) and the kernels that take the most (right), as shares of the total.

    The kind that dominates is the structural bottleneck: the story's sparse-MLA decode attention at 63 %
    is why tuning the GEMMs bought 6 %.
    """
    kinds = breakdown.kinds.copy()
    if kinds.empty:
        raise PlotError("the breakdown is empty")
    kinds["pct"] = kinds["share"] * 100
    kinds["text"] = [f"{p:.0f}%" if p >= 1 else f"{p:.1f}%" for p in kinds["pct"]]
    order = list(kinds.sort_values("pct", ascending=False)["kind"])
    domain = [k for k in KIND_COLORS if k in set(kinds["kind"])] + [k for k in order if k not in KIND_COLORS]
    color_range = [KIND_COLORS.get(k, "#999999") for k in domain]
    color = alt.Color("kind:N", title="kernel kind", scale=alt.Scale(domain=domain, range=color_range))
    pct_max = float(kinds["pct"].max())
    left_base = alt.Chart(kinds)
    left = (
        left_base.mark_bar(height=20).encode(
            x=alt.X(
                "pct:Q", title="share of GPU kernel time (%)", scale=alt.Scale(domain=[0, min(100, pct_max * 1.2)])
            ),
            y=alt.Y("kind:N", title=None, sort=order),
            color=color,
            tooltip=[alt.Tooltip("kind:N"), alt.Tooltip("pct:Q", format=".1f"), alt.Tooltip("ms:Q", format=",.1f")],
        )
        + left_base.mark_text(align="left", dx=4, fontSize=12).encode(
            x="pct:Q", y=alt.Y("kind:N", sort=order), text="text:N"
        )
    ).properties(width=260, height=30 * len(order), title=alt.Title("by kind", fontSize=13))
    kernels = breakdown.kernels.head(top).copy()
    kernels["pct"] = kernels["share"] * 100
    kernels["name"] = [_short(str(k)) for k in kernels["kernel"]]
    kernels["text"] = [f"{p:.1f}%" for p in kernels["pct"]]
    korder = list(kernels["name"])
    right_base = alt.Chart(kernels)
    right = (
        right_base.mark_bar(height=18).encode(
            x=alt.X(
                "pct:Q",
                title="share of GPU kernel time (%)",
                scale=alt.Scale(domain=[0, min(100, float(kernels["pct"].max()) * 1.2)]),
            ),
            y=alt.Y("name:N", title=None, sort=korder, axis=alt.Axis(labelLimit=340)),
            color=color,
            tooltip=[alt.Tooltip("kernel:N"), alt.Tooltip("pct:Q", format=".1f"), alt.Tooltip("ms:Q", format=",.1f")],
        )
        + right_base.mark_text(align="left", dx=4, fontSize=12).encode(
            x="pct:Q", y=alt.Y("name:N", sort=korder), text="text:N"
        )
    ).properties(
        width=260, height=26 * len(korder), title=alt.Title(f"top {plural(len(korder), 'kernel')}", fontSize=13)
    )
    if title is None:
        first_kind = kinds.sort_values("pct", ascending=False).iloc[0]
        _, share = breakdown.top()
        kind = str(first_kind["kind"])
        head = f"{kind.capitalize()} kernels take {first_kind['pct']:.0f}% of GPU time"
        if abs(share * 100 - float(first_kind["pct"])) < 1.0 and kernels["kind"].iloc[0] == kind:
            title = f"{head}, nearly all of it in one kernel"
        else:
            title = f"{head}; the top kernel alone {share:.0%}"
    subtitle = (
        f"{fmt_ms(breakdown.gpu_ms)} of GPU kernel time in the profile{breakdown.clock.tag}; "
        f"top kernel: {breakdown.top()[0]}"
    )
    chart_out: alt.HConcatChart = (
        alt.hconcat(left, right, spacing=40)
        .resolve_scale(color="shared")
        .properties(title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle))
    )
    return chart_out
