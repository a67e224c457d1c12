"""Memory charts: GPU memory over time with the startup phases, and the per-GPU budget predicted vs observed."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

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


@dataclass(frozen=True)
class _TimeAxis:
    """Seconds since sampling started -> the x axis: the reader's clock (:func:`_reading_time`), in seconds,
    minutes or hours by the span shown."""

    reading: Callable[[float], float]
    div: float
    unit: str
    t_min: float
    t_max: float

    @classmethod
    def over(cls, reading: Callable[[float], float], t: pd.Series) -> _TimeAxis:
        first, last = float(t.min()), float(t.max())
        span_s = reading(last) - reading(first)
        # Seconds for a launch, minutes for a benchmark, hours for a day: tick labels stay short.
        div, unit = (1.0, "s") if span_s <= 600 else (60.0, "min") if span_s <= 3 * 3600 else (3600.0, "h")
        return cls(reading, div, unit, float(reading(first)) / div, float(reading(last)) / div)

    def __call__(self, t: float) -> float:
        return float(self.reading(t)) / self.div

    def scale(self) -> alt.Scale:
        return alt.Scale(domain=[self.t_min, self.t_max], nice=False)


@dataclass(frozen=True)
class _Device:
    """What the samples measure, in the chart's words: a GPU's memory (nvidia-smi), or on a host without
    one (vLLM's CPU build) the resident memory of the server's process group on the host's memory node."""

    prefix: str
    subject: str
    axis: str
    legend: str
    capacity: str
    per: str
    counted: str
    source: str

    GPU: ClassVar[_Device]
    HOST: ClassVar[_Device]

    @classmethod
    def of(cls, samples: pd.DataFrame) -> _Device:
        return cls.HOST if samples.attrs.get("memory_of") == "host" else cls.GPU


_Device.GPU = _Device(
    prefix="GPU",
    subject="GPU memory",
    axis="GPU memory used (GiB)",
    legend="GPU (nvidia-smi index)",
    capacity="capacity",
    per="per GPU",
    counted="GPU",
    source="nvidia-smi on the server host",
)
_Device.HOST = _Device(
    prefix="node",
    subject="Host memory",
    axis="resident memory of the server's processes (GiB)",
    legend="host memory node",
    capacity="host memory (MemTotal)",
    per="of host memory",
    counted="memory node",
    source="ps (RSS of the server's process group) on the server host, no GPU",
)


@dataclass(frozen=True)
class _TimelineFrames:
    """What a memory timeline draws, already on its axis: one line per GPU, the phase bands (None: no band
    layer), the reference lines (capacity, the static cap), the OOM's point (None: not drawn)."""

    lines: pd.DataFrame  # t, used_gib, GPU, width, _top (the highlighted GPU last)
    spans: pd.DataFrame | None  # phase, start_s, end_s
    refs: pd.DataFrame  # y, label, dash ("solid": capacity, "dashed": the static cap)
    oom_point: pd.DataFrame | None  # t (kept inside the axis), used_gib, label
    oom_at: float | None  # the OOM's time on the axis, which may lie outside the samples
    oom: OomPoint | None
    axis: _TimeAxis
    clock: Clock
    total_gib: float
    gpu_names: list[str]
    gpu_range: list[str]
    t0: pd.Timestamp | None
    device: _Device

    @property
    def y_scale(self) -> alt.Scale:
        return alt.Scale(domain=[0, self.total_gib * 1.1], nice=False)  # room above capacity for the OOM label


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
    references: Sequence[tuple[float, str]] = (),
) -> alt.LayerChart:
    """Used memory per GPU over time, with the startup phases as bands, the card's capacity, the line
    ``mem_fraction_static`` puts under weights + KV pool, and the OOM marked with its figures.

    ``clock`` is the server's (a twin's samples are drawn on the modelled hardware's time axis, and the
    axis says so); by default the one the samples carry (``samples.attrs["clock"]``), else as measured.

    ``samples`` is :meth:`dsv4lab.serving.gpumem.GpuSampler.frame`. Give the server's ``log`` (a local path or its
    lines) and the phases and the OOM are read from it on the samples' clock (the host's UTC offset they
    carry); or pass ``phases`` / ``oom`` from :mod:`dsv4lab.model.budget` yourself. A ``preflight`` supplies
    ``mem_fraction_static`` and the free memory before load that place the static line exactly; without
    it the line is estimated from the GPU's lowest sample. ``highlight`` (default: the OOM's GPU) is drawn
    thicker and on top. ``references`` are further dashed lines, each ``(GiB, label)`` (a prediction).

    Samples whose ``attrs["memory_of"]`` is ``"host"`` (vLLM's CPU build: the server's process group's
    resident memory against the memory node's total) are labelled as host memory, not GPU memory.
    """
    f = _timeline_frames(
        samples,
        log=log,
        preflight=preflight,
        phases=phases,
        oom=oom,
        mem_fraction_static=mem_fraction_static,
        free_before_load_gib=free_before_load_gib,
        gpus=gpus,
        highlight=highlight,
        max_points=max_points,
        clock=clock,
        references=references,
    )
    layers: list[Any] = [] if f.spans is None else [_phase_bands(f, f.spans)]
    layers += [_memory_lines(f), _reference_rules(f), *_reference_labels(f)]
    if f.oom_point is not None and f.oom_at is not None:
        layers += _oom_marker(f, f.oom_point, f.oom_at)
    chart = alt.layer(*layers).resolve_scale(color="independent", strokeDash="independent")
    out: alt.LayerChart = chart.properties(
        width=WIDTH,
        height=320,
        title=alt.Title(_timeline_title(f, config, title), subtitle=_timeline_subtitle(f, samples)),
    )
    return out


# -- the timeline's data ---------------------------------------------------------------------------------------


def _timeline_frames(
    samples: pd.DataFrame,
    *,
    log: LogSource | None,
    preflight: Preflight | None,
    phases: Sequence[PhaseSpan] | pd.DataFrame | None,
    oom: OomPoint | None,
    mem_fraction_static: float | None,
    free_before_load_gib: float | None,
    gpus: Sequence[int] | None,
    highlight: int | None,
    max_points: int,
    clock: Clock | None,
    references: Sequence[tuple[float, str]] = (),
) -> _TimelineFrames:
    """The samples, phases, references and OOM as the chart's frames, every time on the reader's clock."""
    if samples is None or samples.empty:
        raise PlotError("no GPU samples to draw (was the sampler started before the server?)")
    if log is not None:
        phases, oom = _phases_and_oom_from_log(samples, log, phases, oom)
    if preflight is not None:
        mem_fraction_static = mem_fraction_static or preflight.settings.mem_fraction_static
        if free_before_load_gib is None:
            free_before_load_gib = _preflight_free_before_load(preflight, oom, highlight)
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
        kind = samples.attrs.get("clock")
        clock = Clock.twin(None) if isinstance(kind, str) and kind.startswith("twin") else REAL
    spans = _spans_frame(phases, t0)
    axis = _TimeAxis.over(_reading_time(clock, spans), data["t"])
    total = float(data["total_mib"].max()) / 1024
    device = _Device.of(samples)
    lines, gpu_names, gpu_range = _lines_frame(data, axis, highlight, device.prefix)
    oom_at = (
        axis((oom.time - t0).total_seconds()) if oom is not None and oom.time is not None and t0 is not None else None
    )
    return _TimelineFrames(
        lines=lines,
        spans=None if spans.empty else _spans_on_axis(spans, axis),
        refs=_refs_frame(data, total, highlight, mem_fraction_static, free_before_load_gib, device, references),
        oom_point=None if oom is None or oom_at is None else _oom_frame(oom, oom_at, axis, lines, total),
        oom_at=oom_at,
        oom=oom,
        axis=axis,
        clock=clock,
        total_gib=total,
        gpu_names=gpu_names,
        gpu_range=gpu_range,
        t0=t0,
        device=device,
    )


def _phases_and_oom_from_log(
    samples: pd.DataFrame,
    log: LogSource,
    phases: Sequence[PhaseSpan] | pd.DataFrame | None,
    oom: OomPoint | None,
) -> tuple[Sequence[PhaseSpan] | pd.DataFrame, OomPoint | None]:
    """What the caller did not give, read from the log in the host's timezone (the UTC offset the samples carry)."""
    events = log_events(log)
    host_tz = _dt.timezone(_dt.timedelta(seconds=int(samples.attrs.get("utc_offset_s", 0))))
    tz = host_tz if "utc_offset_s" in samples.attrs else None
    phases = phases if phases is not None else phases_from_log(events, tz=tz)
    oom = oom if oom is not None else oom_point(events, tz=tz)
    return phases, oom


def _preflight_free_before_load(preflight: Preflight, oom: OomPoint | None, highlight: int | None) -> float:
    """The free memory before load of the GPU the chart is about: the OOM's, the highlighted, else the tightest."""
    focus = oom.gpu if oom is not None and oom.gpu is not None else highlight
    if focus is None or focus >= len(preflight.per_gpu):
        focus = min(preflight.per_gpu, key=lambda g: g.free_before_load_gib).gpu
    return preflight.per_gpu[focus].free_before_load_gib


def _lines_frame(
    data: pd.DataFrame, axis: _TimeAxis, highlight: int | None, prefix: str = "GPU"
) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The lines' rows with the GPUs' names and colours; the highlighted GPU is black, thicker, and last."""
    lines = pd.DataFrame(
        {
            "t": [round(axis(float(t)), 4) for t in data["t"]],
            "used_gib": (data["used_mib"] / 1024).round(3),
            "GPU": [f"{prefix} {g}" for g in data["gpu"]],
            "width": [3.0 if g == highlight else 1.5 for g in data["gpu"]],
        }
    )
    gpu_names = sorted(lines["GPU"].unique(), key=lambda s: int(s.split()[1]))
    palette = [c for c in GPU_COLORS if c != GPU_COLORS[0]][: len(gpu_names)]
    gpu_range = ["#000000" if name == f"{prefix} {highlight}" else palette[i] for i, name in enumerate(gpu_names)]
    # The highlighted GPU is drawn last, on top of the others it overlaps.
    top = (lines["GPU"] == f"{prefix} {highlight}").astype(int)
    lines = lines.assign(_top=top).sort_values(["_top", "GPU", "t"])
    return lines, gpu_names, gpu_range


def _spans_on_axis(spans: pd.DataFrame, axis: _TimeAxis) -> pd.DataFrame:
    """The bands on the axis, cut to the samples' time range; the last one (crash, serving) runs to the end."""
    spans = spans.assign(
        start_s=[axis(float(t)) for t in spans["start_s"]], end_s=[axis(float(t)) for t in spans["end_s"]]
    )
    spans["start_s"] = spans["start_s"].clip(lower=axis.t_min, upper=axis.t_max)
    spans["end_s"] = spans["end_s"].clip(lower=axis.t_min, upper=axis.t_max)
    if spans.iloc[-1]["phase"] in ("crash", "serving"):
        spans.loc[spans.index[-1], "end_s"] = axis.t_max  # the log ends; the memory story does not
    out: pd.DataFrame = spans[spans["end_s"] > spans["start_s"]]
    return out


def _refs_frame(
    data: pd.DataFrame,
    total: float,
    highlight: int | None,
    mem_fraction_static: float | None,
    free_before_load_gib: float | None,
    device: _Device | None = None,
    references: Sequence[tuple[float, str]] = (),
) -> pd.DataFrame:
    """The capacity line, and the cap SGLang puts on weights + KV pool: context and other processes plus
    ``mem_fraction_static`` of the free memory before load (estimated from the lowest sample when not given);
    then the caller's ``references``."""
    what = (device or _Device.GPU).capacity
    refs = [{"y": total, "label": f"{what} {total:.1f} GiB", "dash": "solid"}]
    refs += [{"y": float(y), "label": str(label), "dash": "dashed"} for y, label in references]
    if mem_fraction_static is not None:
        if free_before_load_gib is None:
            gpu = highlight if highlight is not None else data["gpu"].iloc[0]
            lowest = float(data.loc[data["gpu"] == gpu, "used_mib"].min())
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
    frame: pd.DataFrame = pd.DataFrame(refs)
    return frame


def _oom_frame(oom: OomPoint, oom_t: float, axis: _TimeAxis, lines: pd.DataFrame, total: float) -> pd.DataFrame:
    """Where the OOM is drawn: at the failed allocation's time and the memory the GPU held (when the log does
    not say, its line's peak)."""
    used = oom.used_gib
    if used is None or not np.isfinite(used):
        near = lines[lines["GPU"] == f"GPU {oom.gpu}"]
        used = float(near["used_gib"].max()) if len(near) else total
    point: pd.DataFrame = pd.DataFrame(
        [{"t": min(max(oom_t, axis.t_min), axis.t_max), "used_gib": used, "label": oom.label()}]
    )
    return point


# -- the timeline's layers -------------------------------------------------------------------------------------


def _phase_bands(f: _TimelineFrames, spans: pd.DataFrame) -> alt.Chart:
    domain = [p for p in PHASE_COLORS if p in set(spans["phase"])]
    chart: alt.Chart = (
        alt.Chart(spans)
        .mark_rect(opacity=0.16)
        .encode(
            x=alt.X("start_s:Q", scale=f.axis.scale()),
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
    return chart


def _memory_lines(f: _TimelineFrames) -> alt.Chart:
    since = "the server's first log line" if f.clock.is_twin and f.spans is not None else "sampling started"
    unit = f.axis.unit
    x = alt.X(
        "t:Q",
        title=f"time since {since} ({unit}, modelled hardware)" if f.clock.is_twin else f"time since {since} ({unit})",
        scale=f.axis.scale(),
        axis=alt.Axis(tickCount=10, labelOverlap=True),
    )
    chart: alt.Chart = (
        alt.Chart(f.lines)
        .mark_line(interpolate="step-after")
        .encode(
            x=x,
            y=alt.Y("used_gib:Q", title=f.device.axis, scale=f.y_scale),
            color=alt.Color(
                "GPU:N",
                title=f.device.legend,
                scale=alt.Scale(domain=f.gpu_names, range=f.gpu_range),
                sort=f.gpu_names,
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
    return chart


def _reference_rules(f: _TimelineFrames) -> alt.Chart:
    chart: alt.Chart = (
        alt.Chart(f.refs)
        .mark_rule(color="#333333", strokeWidth=1.2)
        .encode(
            y=alt.Y("y:Q", scale=f.y_scale),
            strokeDash=alt.StrokeDash(
                "dash:N", scale=alt.Scale(domain=["solid", "dashed"], range=[[1, 0], [6, 4]]), legend=None
            ),
        )
    )
    return chart


def _reference_labels(f: _TimelineFrames) -> list[alt.Chart]:
    """Capacity's label under its line, the cap's over its line, at whichever end of the chart has no line
    where the text would go (usually the left, before the memory rises)."""
    t_min, t_max = f.axis.t_min, f.axis.t_max
    y_top = f.total_gib * 1.1
    labels = []
    for y, label, dash in zip(f.refs["y"], f.refs["label"], f.refs["dash"], strict=True):
        below = dash == "solid"
        band = (float(y) - 0.07 * y_top, float(y)) if below else (float(y), float(y) + 0.07 * y_top)
        width = min(0.95, len(str(label)) * 6.6 / WIDTH) * (t_max - t_min)
        side = _free_side(f.lines, band, width, t_min, t_max)
        labels.append(
            alt.Chart(pd.DataFrame([{"x": t_min if side == "left" else t_max, "y": y, "label": label}]))
            .mark_text(
                align=side,
                baseline="top" if below else "bottom",
                dx=4 if side == "left" else -4,
                dy=4 if below else -3,
                fontSize=11,
                color="#333333",
            )
            .encode(x=alt.X("x:Q", scale=f.axis.scale()), y=alt.Y("y:Q", scale=f.y_scale), text="label:N")
        )
    return labels


def _oom_marker(f: _TimelineFrames, point: pd.DataFrame, oom_t: float) -> list[alt.Chart]:
    """The diamond at the failed allocation, and its figures above the capacity line, where nothing else is
    drawn (the label cannot hide a line there)."""
    diamond = (
        alt.Chart(point)
        .mark_point(shape="diamond", size=160, filled=True, color=BUDGET_COLORS["short"], stroke="black", strokeWidth=1)
        .encode(
            x=alt.X("t:Q", scale=f.axis.scale()),
            y=alt.Y("used_gib:Q", scale=f.y_scale),
            tooltip=["label:N"],
        )
    )
    t_min, t_max = f.axis.t_min, f.axis.t_max
    right = oom_t > t_min + 0.5 * (t_max - t_min)
    label = (
        alt.Chart(point.assign(cap=f.total_gib))
        .mark_text(
            align="right" if right else "left",
            baseline="bottom",
            dx=8 if right else -8,
            dy=-6,
            fontSize=12,
            fontWeight="bold",
            color=BUDGET_COLORS["short"],
        )
        .encode(x=alt.X("t:Q", scale=f.axis.scale()), y=alt.Y("cap:Q", scale=f.y_scale), text="label:N")
    )
    return [diamond, label]


def _timeline_title(f: _TimelineFrames, config: str, title: str | Sequence[str] | None) -> str | list[str]:
    if title is not None:
        return title if isinstance(title, str) else list(title)
    subject = config or f.device.subject
    if f.oom is not None:
        where = f" in {f.oom.phase}" if f.oom.phase else ""
        return f"{subject}: {f.device.prefix} {f.oom.gpu} ran out of memory{where}"
    peak = float(f.lines["used_gib"].max())
    return f"{subject}: peak {peak:.1f} of {f.total_gib:.1f} GiB {f.device.per}"


def _timeline_subtitle(f: _TimelineFrames, samples: pd.DataFrame) -> str:
    start = ""
    if f.t0 is not None:
        start = f" from {f.t0.strftime('%Y-%m-%d %H:%M:%S')} (host time, UTC{_offset(f.t0)})"
    interval = samples.attrs.get("interval_ms")
    every = f" every {fmt_ms(float(interval))}" if interval else ""
    subtitle = f"{f.device.source}{every}{start}; {plural(len(f.gpu_names), f.device.counted)}"
    if f.clock.is_twin:
        subtitle += "; twin run: times on the modelled hardware's clock"
    return subtitle


def _reading_time(clock: Clock, spans: pd.DataFrame) -> Callable[[float], float]:
    """Measured seconds since sampling started -> the reader's seconds. On the twin they count from the
    server's first log line (the first phase's start) on the modelled hardware's clock; before it the twin
    is a Python process starting, wall time that models nothing, kept unscaled (a few seconds of flat line)."""
    if not clock.is_twin:
        return lambda t: t
    origin = float(spans["start_s"].min()) if not spans.empty else 0.0

    def reading(t: float) -> float:
        return t - origin

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
    frame = _budget_panels(_budget_input(data), gpus)
    panels = list(dict.fromkeys(frame["panel"]))
    total = float(frame["total_gib"].dropna().max()) if frame["total_gib"].notna().any() else None
    frame = frame.merge(_bar_tops(frame), on=["panel", "source"], how="left")
    chart = alt.layer(*_budget_layers(frame, total)).properties(width=150, height=360)
    faceted: alt.FacetChart = (
        chart.facet(
            column=alt.Column(
                "panel:N", title=None, sort=panels, header=alt.Header(labelFontSize=13, labelFontWeight="bold")
            ),
            spacing=18,
        )
        .resolve_scale(x="independent")
        .properties(
            title=alt.Title(
                _budget_title(frame) if title is None else title if isinstance(title, str) else list(title),
                subtitle=_budget_subtitle(frame, total),
            )
        )
    )
    return faceted


def _budget_input(data: BudgetInput) -> pd.DataFrame:
    """One tidy budget frame, from budget_frame output or a mapping of configs to (preflight, observed)."""
    if isinstance(data, Mapping):
        frames = [budget_frame(p, o, config=name) for name, (p, o) in data.items()]
        frame = pd.concat([f for f in frames if not f.empty], ignore_index=True) if frames else pd.DataFrame()
    else:
        frame = data.copy()
    if frame.empty:
        raise PlotError("no budget to draw: give a preflight, an observed budget or both for at least one config")
    return frame


def _budget_panels(frame: pd.DataFrame, gpus: str | Sequence[int]) -> pd.DataFrame:
    """The chosen GPUs of each config, each a panel (``config · GPU n``), with the bars' notes."""
    parts = []
    for name in dict.fromkeys(frame["config"]):
        f = frame[frame["config"] == name]
        if gpus == "focus":
            chosen = [_focus_gpu(f)]
        elif gpus == "all":
            chosen = sorted(f["gpu"].unique())
        else:
            chosen = [int(g) for g in gpus if g in set(f["gpu"])]
        parts.append(f[f["gpu"].isin(chosen)])
    out: pd.DataFrame = pd.concat(parts, ignore_index=True)
    if out.empty:
        raise PlotError(f"none of the GPUs {gpus} is in the budget")
    out["panel"] = [f"{c} · GPU {g}" if c else f"GPU {g}" for c, g in zip(out["config"], out["gpu"], strict=True)]
    out["gib"] = out["gib"].round(3)
    out["note"] = np.where(out["estimated"], "copied from TP rank 0 (not logged by this rank)", "")
    return out


def _bar_tops(frame: pd.DataFrame) -> pd.DataFrame:
    """Each bar's height and the label over it."""
    tops: pd.DataFrame = pd.DataFrame(
        [
            {"panel": panel, "source": source, "top": float(g["gib"].sum()), "label": _bar_label(g, str(source))}
            for (panel, source), g in frame.groupby(["panel", "source"], sort=False)
        ]
    )
    return tops


def _budget_layers(frame: pd.DataFrame, total: float | None) -> list[alt.Chart]:
    """The stacked bars, the label over each, and the card's capacity as a dashed rule."""
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
    layers = [bars, labels]
    if total is not None:
        layers.append(
            base.transform_filter(alt.datum.order == 0)
            .mark_rule(color="#222222", strokeDash=[6, 3], strokeWidth=1.2)
            .encode(y=alt.datum(total))
        )
    return layers


def _budget_subtitle(frame: pd.DataFrame, total: float | None) -> list[str]:
    subtitle = ["left bar: memory model (preflight) · right bar: what the server log reports · labels in GiB"]
    notes = []
    if total is not None:
        notes.append(f"dashed line: card capacity {total:.1f} GiB")
    if bool(frame["estimated"].any()):
        notes.append("pale: not logged by this GPU's rank, taken from TP rank 0")
    if notes:
        subtitle.append(" · ".join(notes))
    return subtitle


def _budget_title(frame: pd.DataFrame) -> str:
    short = frame[(frame["category"] == "short") & (frame["gib"] > 0) & (frame["source"] == "predicted")]
    failing = list(dict.fromkeys(short["config"]))
    fitting = [c for c in dict.fromkeys(frame["config"]) if c not in failing]
    if not failing:
        return "Memory budget per GPU: every config fits"
    worst = short.sort_values("gib", ascending=False).iloc[0]
    head = f"{worst['config'] or 'The config'} is {worst['gib']:.1f} GiB short in CUDA graph capture"
    return head + (f"; {' and '.join(fitting)} fit" if fitting else "")
