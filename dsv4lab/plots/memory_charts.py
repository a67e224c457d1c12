"""Memory charts: GPU memory over time with the startup phases, and the per-GPU budget predicted vs observed."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import altair as alt
import numpy as np
import pandas as pd

from dsv4lab.counts import plural
from dsv4lab.errors import PlotError
from dsv4lab.logs.source import LogSource
from dsv4lab.model.budget import (
    CATEGORIES,
    ObservedBudget,
    OomPoint,
    PhaseSpan,
    budget_frame,
    log_events,
    oom_point,
    phases_from_log,
)
from dsv4lab.model.memory import Preflight
from dsv4lab.plots.theme import BUDGET_COLORS, GPU_COLORS, PHASE_COLORS, WIDTH
from dsv4lab.units import REAL, Clock, fmt_ms

__all__ = ["downsample_timeline", "memory_budget", "memory_timeline"]

#: The most rows a chart embeds (Altair's own limit is 5,000 per data set).
MAX_POINTS = 5000


def downsample_timeline(samples: pd.DataFrame, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """At most ``max_points`` rows: per GPU and time bucket, the lowest and the highest sample.

    Keeping both extremes of every bucket (in time order) preserves what a memory chart is read for —
    the peak before an OOM, the drop after a crash — where a mean or every n-th sample would cut them.
    """
    if len(samples) <= max_points:
        return samples
    gpus = samples["gpu"].nunique()
    buckets = max(1, max_points // (2 * max(gpus, 1)))
    t = samples["t"].to_numpy(dtype=float)
    lo, hi = float(np.nanmin(t)), float(np.nanmax(t))
    width = (hi - lo) / buckets or 1.0
    frame = samples.assign(_bucket=np.minimum(((t - lo) / width).astype(int), buckets - 1))
    grouped = frame.groupby(["gpu", "_bucket"], sort=False)["used_mib"]
    keep = pd.Index(grouped.idxmin()).union(pd.Index(grouped.idxmax()))
    out: pd.DataFrame = frame.loc[keep].drop(columns="_bucket").sort_values(["gpu", "t"]).reset_index(drop=True)
    return out


def _spans_frame(phases: Sequence[PhaseSpan] | pd.DataFrame | None, t0: pd.Timestamp | None) -> pd.DataFrame:
    cols = ["phase", "start_s", "end_s"]
    if phases is None or t0 is None:
        empty: pd.DataFrame = pd.DataFrame(columns=cols)
        return empty
    rows: list[tuple[str, pd.Timestamp, pd.Timestamp]]
    if isinstance(phases, pd.DataFrame):
        rows = [
            (str(p), pd.Timestamp(s), pd.Timestamp(e))
            for p, s, e in zip(phases["phase"], phases["start"], phases["end"], strict=True)
        ]
    else:
        rows = [(p.name, p.start, p.end) for p in phases]
    out = [
        {"phase": name, "start_s": (start - t0).total_seconds(), "end_s": (end - t0).total_seconds()}
        for name, start, end in rows
    ]
    frame: pd.DataFrame = pd.DataFrame(out, columns=cols)
    return frame


def memory_timeline(
    samples: pd.DataFrame,
    *,
    log: LogSource | None = None,
    preflight: Preflight | None = None,
    phases: Sequence[PhaseSpan] | pd.DataFrame | None = None,
    oom: OomPoint | None = None,
    mem_fraction_static: float | None = None,
    free_before_load_gib: float | None = None,
    gpus: Sequence[int] | None = None,
    highlight: int | None = None,
    config: str = "",
    title: str | Sequence[str] | None = None,
    max_points: int = MAX_POINTS,
    clock: Clock | None = None,
) -> alt.LayerChart:
    """Used memory per GPU over time, with the startup phases as bands, the card's capacity, the line
    ``mem_fraction_static`` puts under weights + KV pool, and the OOM marked with its figures.

    ``clock`` is the server's (a twin's samples are drawn on the modelled hardware's time axis, and the
    axis says so); by default the one the samples carry (``samples.attrs["time_scale"]``), else as measured.

    ``samples`` is :meth:`dsv4lab.serving.gpumem.GpuSampler.frame`. Give the server's ``log`` (a local path or its
    lines) and the phases and the OOM are read from it on the samples' clock (the host's UTC offset they
    carry); or pass ``phases`` / ``oom`` from :mod:`dsv4lab.model.budget` yourself. A ``preflight`` supplies
    ``mem_fraction_static`` and the free memory before load that place the static line exactly; without
    it the line is estimated from the GPU's lowest sample. ``highlight`` (default: the OOM's GPU) is drawn
    thicker and on top.
    """
    if samples is None or samples.empty:
        raise PlotError("no GPU samples to draw (was the sampler started before the server?)")
    if log is not None:
        events = log_events(log)
        host_tz = _dt.timezone(_dt.timedelta(seconds=int(samples.attrs.get("utc_offset_s", 0))))
        tz = host_tz if "utc_offset_s" in samples.attrs else None
        phases = phases if phases is not None else phases_from_log(events, tz=tz)
        oom = oom if oom is not None else oom_point(events, tz=tz)
    if preflight is not None:
        mem_fraction_static = mem_fraction_static or preflight.settings.mem_fraction_static
        if free_before_load_gib is None:
            focus = oom.gpu if oom is not None and oom.gpu is not None else highlight
            if focus is None or focus >= len(preflight.per_gpu):
                focus = min(preflight.per_gpu, key=lambda g: g.free_before_load_gib).gpu
            free_before_load_gib = preflight.per_gpu[focus].free_before_load_gib
    data = samples if gpus is None else samples[samples["gpu"].isin(list(gpus))]
    if data.empty:
        raise PlotError(f"no samples for GPUs {list(gpus or [])}; the frame has {sorted(samples['gpu'].unique())}")
    if highlight is None and oom is not None:
        highlight = oom.gpu
    t0: pd.Timestamp | None = None
    if "time" in data.columns and len(data):
        first = data.iloc[0]
        t0 = pd.Timestamp(first["time"]) - pd.Timedelta(seconds=float(first["t"]))
    data = downsample_timeline(data, max_points - 64)
    if clock is None:
        scale = samples.attrs.get("time_scale")
        clock = Clock.twin(float(scale)) if isinstance(scale, (int, float)) and scale > 0 else REAL
    spans = _spans_frame(phases, t0)
    reading = _reading_time(clock, spans)
    span_s = reading(float(data["t"].max())) - reading(float(data["t"].min()))
    # Seconds for a launch, minutes for a benchmark, hours for a day: tick labels stay short.
    div, unit = (1.0, "s") if span_s <= 600 else (60.0, "min") if span_s <= 3 * 3600 else (3600.0, "h")

    def axis(t: float) -> float:
        return float(reading(t)) / div

    t_max = axis(float(data["t"].max()))
    t_min = axis(float(data["t"].min()))
    total = float(data["total_mib"].max()) / 1024
    lines = pd.DataFrame(
        {
            "t": [round(axis(float(t)), 4) for t in data["t"]],
            "used_gib": (data["used_mib"] / 1024).round(3),
            "GPU": [f"GPU {g}" for g in data["gpu"]],
            "width": [3.0 if g == highlight else 1.5 for g in data["gpu"]],
        }
    )
    gpu_names = sorted(lines["GPU"].unique(), key=lambda s: int(s.split()[1]))
    palette = [c for c in GPU_COLORS if c != GPU_COLORS[0]][: len(gpu_names)]
    gpu_range = ["#000000" if name == f"GPU {highlight}" else palette[i] for i, name in enumerate(gpu_names)]
    # The highlighted GPU is drawn last, on top of the others it overlaps.
    lines = lines.assign(_top=(lines["GPU"] == f"GPU {highlight}").astype(int)).sort_values(["_top", "GPU", "t"])
    since = "the server's first log line" if clock.is_twin and not spans.empty else "sampling started"
    x = alt.X(
        "t:Q",
        title=f"time since {since} ({unit}, modelled hardware)" if clock.is_twin else f"time since {since} ({unit})",
        scale=alt.Scale(domain=[t_min, t_max], nice=False),
        axis=alt.Axis(tickCount=10, labelOverlap=True),
    )
    y_scale = alt.Scale(domain=[0, total * 1.1], nice=False)  # room above capacity for the OOM label
    layers: list[Any] = []

    spans["start_s"] = [axis(float(t)) for t in spans["start_s"]]
    spans["end_s"] = [axis(float(t)) for t in spans["end_s"]]
    if not spans.empty:
        spans["start_s"] = spans["start_s"].clip(lower=t_min, upper=t_max)
        spans["end_s"] = spans["end_s"].clip(lower=t_min, upper=t_max)
        if spans.iloc[-1]["phase"] in ("crash", "serving"):
            spans.loc[spans.index[-1], "end_s"] = t_max  # the log ends; the memory story does not
        spans = spans[spans["end_s"] > spans["start_s"]]
        domain = [p for p in PHASE_COLORS if p in set(spans["phase"])]
        layers.append(
            alt.Chart(spans)
            .mark_rect(opacity=0.16)
            .encode(
                x=alt.X("start_s:Q", scale=alt.Scale(domain=[t_min, t_max], nice=False)),
                x2="end_s:Q",
                color=alt.Color(
                    "phase:N",
                    title="startup phase (from the log)",
                    scale=alt.Scale(domain=domain, range=[PHASE_COLORS[p] for p in domain]),
                    legend=alt.Legend(orient="right", symbolOpacity=0.5),
                ),
                tooltip=[
                    alt.Tooltip("phase:N"),
                    alt.Tooltip("start_s:Q", format=".2f"),
                    alt.Tooltip("end_s:Q", format=".2f"),
                ],
            )
        )

    layers.append(
        alt.Chart(lines)
        .mark_line(interpolate="step-after")
        .encode(
            x=x,
            y=alt.Y("used_gib:Q", title="GPU memory used (GiB)", scale=y_scale),
            color=alt.Color(
                "GPU:N",
                title="GPU (nvidia-smi index)",
                scale=alt.Scale(domain=gpu_names, range=gpu_range),
                sort=gpu_names,
            ),
            order=alt.Order("_top:Q"),
            strokeWidth=alt.StrokeWidth("width:Q", scale=None, legend=None),
            detail="GPU:N",
            tooltip=[
                alt.Tooltip("GPU:N"),
                alt.Tooltip("t:Q", format=".2f", title=unit),
                alt.Tooltip("used_gib:Q", format=".2f", title="GiB"),
            ],
        )
    )

    refs = [{"y": total, "label": f"capacity {total:.1f} GiB", "dash": "solid"}]
    if mem_fraction_static is not None:
        if free_before_load_gib is None:
            lowest = float(
                data.loc[data["gpu"] == (highlight if highlight is not None else data["gpu"].iloc[0]), "used_mib"].min()
            )
            free_before_load_gib = total - lowest / 1024
            approx = "≈ "
        else:
            approx = ""
        static_top = total - free_before_load_gib + mem_fraction_static * free_before_load_gib
        refs.append(
            {
                "y": static_top,
                "label": f"{approx}cap on weights + KV pool (mem_fraction_static {mem_fraction_static:.2f})",
                "dash": "dashed",
            }
        )
    ref_frame = pd.DataFrame(refs)
    layers.append(
        alt.Chart(ref_frame)
        .mark_rule(color="#333333", strokeWidth=1.2)
        .encode(
            y=alt.Y("y:Q", scale=y_scale),
            strokeDash=alt.StrokeDash(
                "dash:N", scale=alt.Scale(domain=["solid", "dashed"], range=[[1, 0], [6, 4]]), legend=None
            ),
        )
    )
    # Capacity's label under its line, the cap's over its line, at whichever end of the chart has no line
    # where the text would go (usually the left, before the memory rises).
    y_top = total * 1.1
    for row in ref_frame.itertuples():
        below = row.dash == "solid"
        band = (row.y - 0.07 * y_top, row.y) if below else (row.y, row.y + 0.07 * y_top)
        width = min(0.95, len(str(row.label)) * 6.6 / WIDTH) * (t_max - t_min)
        side = _free_side(lines, band, width, t_min, t_max)
        layers.append(
            alt.Chart(pd.DataFrame([{"x": t_min if side == "left" else t_max, "y": row.y, "label": row.label}]))
            .mark_text(
                align=side,
                baseline="top" if below else "bottom",
                dx=4 if side == "left" else -4,
                dy=4 if below else -3,
                fontSize=11,
                color="#333333",
            )
            .encode(
                x=alt.X("x:Q", scale=alt.Scale(domain=[t_min, t_max], nice=False)),
                y=alt.Y("y:Q", scale=y_scale),
                text="label:N",
            )
        )

    if oom is not None and oom.time is not None and t0 is not None:
        oom_t = axis((oom.time - t0).total_seconds())
        used = oom.used_gib
        if used is None or not np.isfinite(used):
            near = lines[lines["GPU"] == f"GPU {oom.gpu}"]
            used = float(near["used_gib"].max()) if len(near) else total
        point = pd.DataFrame([{"t": min(max(oom_t, t_min), t_max), "used_gib": used, "label": oom.label()}])
        layers.append(
            alt.Chart(point)
            .mark_point(
                shape="diamond", size=160, filled=True, color=BUDGET_COLORS["short"], stroke="black", strokeWidth=1
            )
            .encode(
                x=alt.X("t:Q", scale=alt.Scale(domain=[t_min, t_max], nice=False)),
                y=alt.Y("used_gib:Q", scale=y_scale),
                tooltip=["label:N"],
            )
        )
        # Above the capacity line nothing else is drawn: the label cannot hide a line there.
        right = oom_t > t_min + 0.5 * (t_max - t_min)
        layers.append(
            alt.Chart(point.assign(cap=total))
            .mark_text(
                align="right" if right else "left",
                baseline="bottom",
                dx=8 if right else -8,
                dy=-6,
                fontSize=12,
                fontWeight="bold",
                color=BUDGET_COLORS["short"],
            )
            .encode(
                x=alt.X("t:Q", scale=alt.Scale(domain=[t_min, t_max], nice=False)),
                y=alt.Y("cap:Q", scale=y_scale),
                text="label:N",
            )
        )

    subject = config or "GPU memory"
    if title is None:
        if oom is not None:
            where = f" in {oom.phase}" if oom.phase else ""
            title = f"{subject}: GPU {oom.gpu} ran out of memory{where}"
        else:
            peak = float(lines["used_gib"].max())
            title = f"{subject}: peak {peak:.1f} of {total:.1f} GiB per GPU"
    start = ""
    if t0 is not None:
        start = f" from {t0.strftime('%Y-%m-%d %H:%M:%S')} (host time, UTC{_offset(t0)})"
    interval = samples.attrs.get("interval_ms")
    every = f" every {fmt_ms(clock.seconds(float(interval)))}" if interval else ""
    gpus_text = plural(len(gpu_names), "GPU")
    subtitle = f"nvidia-smi on the server host{every}{start}; {gpus_text}"
    if clock.is_twin:
        subtitle += f"; twin run at time scale {clock.time_scale:g}, times shown for the modelled hardware"
    chart = alt.layer(*layers).resolve_scale(color="independent", strokeDash="independent")
    out: alt.LayerChart = chart.properties(
        width=WIDTH, height=320, title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle)
    )
    return out


def _reading_time(clock: Clock, spans: pd.DataFrame) -> Callable[[float], float]:
    """Measured seconds since sampling started -> the reader's seconds. On the twin they count from the
    server's first log line (the first phase's start) on the modelled hardware's clock; before it the twin
    is a Python process starting, wall time that models nothing, kept unscaled (a few seconds of flat line)."""
    if not clock.is_twin:
        return lambda t: t
    origin = float(spans["start_s"].min()) if not spans.empty else 0.0

    def reading(t: float) -> float:
        return clock.seconds(t - origin) if t >= origin else t - origin

    return reading


def _free_side(
    lines: pd.DataFrame, band: tuple[float, float], width: float, t_min: float, t_max: float
) -> Literal["left", "right"]:
    """ "left" or "right": the end of the chart where fewer line points fall inside a label's box."""

    def hits(lo: float, hi: float) -> int:
        inside = lines[(lines["t"] >= lo) & (lines["t"] <= hi)]
        crossing = (inside["used_gib"] >= band[0]) & (inside["used_gib"] <= band[1])
        return int(crossing.sum())

    return "left" if hits(t_min, t_min + width) <= hits(t_max - width, t_max) else "right"


def _offset(t: pd.Timestamp) -> str:
    off = t.utcoffset() if t.tzinfo is not None else None
    if off is None:
        return ""
    minutes = int(off.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


# -- budget ------------------------------------------------------------------------------------------------------


BudgetInput = pd.DataFrame | Mapping[str, tuple[Preflight | None, ObservedBudget | None]]


def _focus_gpu(frame: pd.DataFrame) -> int:
    """The GPU a config's story is about: the one that failed (observed, else predicted), else the tightest."""
    short = frame[(frame["category"] == "short") & (frame["gib"] > 0)]
    for source in ("observed", "predicted"):
        s = short[short["source"] == source]
        if len(s):
            return int(s.sort_values("gib", ascending=False)["gpu"].iloc[0])
    free = frame[(frame["category"] == "free") & (frame["source"] == "predicted")]
    if len(free):
        return int(free.sort_values("gib")["gpu"].iloc[0])
    return int(frame["gpu"].min())


def _bar_label(group: pd.DataFrame, source: str) -> str:
    by = dict(zip(group["category"], group["gib"], strict=False))
    if by.get("short", 0.0) > 0:
        return f"short {by['short']:.1f}" if source == "predicted" else "OOM"
    if "free" in by:
        return f"{by['free']:.1f} free"
    return "cut short"


def memory_budget(
    data: BudgetInput,
    *,
    gpus: str | Sequence[int] = "focus",
    title: str | Sequence[str] | None = None,
) -> alt.FacetChart:
    """Stacked per-GPU budgets, predicted next to observed, one panel per config (A, B, B-fixed ...).

    ``data`` is :func:`dsv4lab.model.budget.budget_frame` output (concatenated over configs) or a mapping
    ``{"Config A": (preflight, observed), ...}``. ``gpus="focus"`` shows each config's failing GPU (else its
    tightest); ``"all"`` every GPU; or a list of indices.
    """
    if isinstance(data, Mapping):
        frames = [budget_frame(p, o, config=name) for name, (p, o) in data.items()]
        frame = pd.concat([f for f in frames if not f.empty], ignore_index=True) if frames else pd.DataFrame()
    else:
        frame = data.copy()
    if frame.empty:
        raise PlotError("no budget to draw: give a preflight, an observed budget or both for at least one config")
    configs = list(dict.fromkeys(frame["config"]))
    parts = []
    for name in configs:
        f = frame[frame["config"] == name]
        if gpus == "focus":
            chosen = [_focus_gpu(f)]
        elif gpus == "all":
            chosen = sorted(f["gpu"].unique())
        else:
            chosen = [int(g) for g in gpus if g in set(f["gpu"])]
        parts.append(f[f["gpu"].isin(chosen)])
    frame = pd.concat(parts, ignore_index=True)
    if frame.empty:
        raise PlotError(f"none of the GPUs {gpus} is in the budget")
    frame["panel"] = [f"{c} · GPU {g}" if c else f"GPU {g}" for c, g in zip(frame["config"], frame["gpu"], strict=True)]
    frame["gib"] = frame["gib"].round(3)
    frame["note"] = np.where(frame["estimated"], "copied from TP rank 0 (not logged by this rank)", "")
    panels = list(dict.fromkeys(frame["panel"]))
    tops = pd.DataFrame(
        [
            {"panel": panel, "source": source, "top": float(g["gib"].sum()), "label": _bar_label(g, str(source))}
            for (panel, source), g in frame.groupby(["panel", "source"], sort=False)
        ]
    )
    total = float(frame["total_gib"].dropna().max()) if frame["total_gib"].notna().any() else None
    frame = frame.merge(tops, on=["panel", "source"], how="left")
    cats = [c for c in CATEGORIES if c in set(frame["category"])]
    y_max = float(frame["top"].max()) * 1.12
    base = alt.Chart(frame)
    x = alt.X("source:N", title=None, sort=["predicted", "observed"], axis=alt.Axis(labelAngle=0, labelFontSize=12))
    bars = base.mark_bar(width=54, stroke="#666666", strokeWidth=0.4).encode(
        x=x,
        y=alt.Y("gib:Q", title="GPU memory (GiB)", stack="zero", scale=alt.Scale(domain=[0, y_max], nice=False)),
        color=alt.Color(
            "category:N",
            title="memory goes to",
            scale=alt.Scale(domain=cats, range=[BUDGET_COLORS[c] for c in cats]),
            sort=cats,
            legend=alt.Legend(orient="right", values=list(reversed(cats))),
        ),
        order=alt.Order("order:Q", sort="ascending"),
        opacity=alt.condition(alt.datum.estimated, alt.value(0.55), alt.value(1.0)),
        tooltip=[
            alt.Tooltip("panel:N", title="config / GPU"),
            alt.Tooltip("source:N"),
            alt.Tooltip("category:N"),
            alt.Tooltip("gib:Q", format=".2f", title="GiB"),
            alt.Tooltip("note:N"),
        ],
    )
    labels = (
        base.transform_filter(alt.datum.order == 0)
        .mark_text(baseline="bottom", dy=-5, fontSize=11, fontWeight="bold", color="#222222")
        .encode(x=x, y=alt.Y("top:Q"), text="label:N")
    )
    layers: list[Any] = [bars, labels]
    if total is not None:
        layers.append(
            base.transform_filter(alt.datum.order == 0)
            .mark_rule(color="#222222", strokeDash=[6, 3], strokeWidth=1.2)
            .encode(y=alt.datum(total))
        )
    if title is None:
        title = _budget_title(frame)
    subtitle = ["left bar: memory model (preflight) · right bar: what the server log reports · labels in GiB"]
    notes = []
    if total is not None:
        notes.append(f"dashed line: card capacity {total:.1f} GiB")
    if bool(frame["estimated"].any()):
        notes.append("pale: not logged by this GPU's rank, taken from TP rank 0")
    if notes:
        subtitle.append(" · ".join(notes))
    chart = alt.layer(*layers).properties(width=150, height=360)
    faceted: alt.FacetChart = (
        chart.facet(
            column=alt.Column(
                "panel:N", title=None, sort=panels, header=alt.Header(labelFontSize=13, labelFontWeight="bold")
            ),
            spacing=18,
        )
        .resolve_scale(x="independent")
        .properties(title=alt.Title(title if isinstance(title, str) else list(title), subtitle=subtitle))
    )
    return faceted


def _budget_title(frame: pd.DataFrame) -> str:
    short = frame[(frame["category"] == "short") & (frame["gib"] > 0) & (frame["source"] == "predicted")]
    failing = list(dict.fromkeys(short["config"]))
    fitting = [c for c in dict.fromkeys(frame["config"]) if c not in failing]
    if not failing:
        return "Memory budget per GPU: every config fits"
    worst = short.sort_values("gib", ascending=False).iloc[0]
    head = f"{worst['config'] or 'The config'} is {worst['gib']:.1f} GiB short in CUDA graph capture"
    return head + (f"; {' and '.join(fitting)} fit" if fitting else "")
