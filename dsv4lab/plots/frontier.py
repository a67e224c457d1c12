"""The Pareto frontier: output throughput per GPU against interactivity (output tok/s per user), every config at
every concurrency it ran, the frontier drawn, the SLO cut shaded and the chosen config marked.

A server at a higher concurrency serves more tokens per GPU and fewer to each user; no one number ranks configs
across that trade, so the field's results page is the frontier: the points no other point beats on both axes.
A TPOT SLO is a floor on interactivity (a user sees about 1000 / TPOT tokens per second), so it cuts the chart
at ``1000 / limit`` and the region left of it is shaded. Points that miss any SLO are drawn hollow.

The frame is one row per config and concurrency (``TuneResult.to_frame()``, or
:func:`dsv4lab.notebook.measurements.frontier_rows` of the measurements a sweep or a campaign recorded), every
figure on the reader's clock.
"""

from __future__ import annotations

from typing import Any

import altair as alt
import pandas as pd

from dsv4lab.errors import PlotError
from dsv4lab.plots.theme import WIDTH
from dsv4lab.units import Clock

__all__ = ["FRONTIER_COLUMNS", "frontier_chart", "pareto_front"]

#: The columns the chart reads.
FRONTIER_COLUMNS = ("config", "concurrency", "tok_s_per_user", "tok_s_per_gpu", "meets_slo")


def pareto_front(frame: pd.DataFrame, x: str = "tok_s_per_user", y: str = "tok_s_per_gpu") -> pd.Series:
    """Whether each row is on the frontier: no other row is at least as good on both axes and better on one."""
    xs, ys = frame[x].to_numpy(dtype=float), frame[y].to_numpy(dtype=float)
    on = []
    for i in range(len(frame)):
        beaten = ((xs >= xs[i]) & (ys >= ys[i]) & ((xs > xs[i]) | (ys > ys[i]))).any()
        on.append(bool(not beaten and xs[i] == xs[i] and ys[i] == ys[i]))  # NaN is never on it
    return pd.Series(on, index=frame.index, name="on_frontier")


def frontier_chart(
    frame: pd.DataFrame,
    *,
    clock: Clock | None = None,
    tpot_limit_ms: float | None = None,
    chosen: str | None = None,
    title: str = "Throughput per GPU against interactivity",
) -> alt.LayerChart:
    """The chart (see module doc). ``tpot_limit_ms`` shades what a TPOT SLO rules out; ``chosen`` names the
    config to mark."""
    missing = [c for c in FRONTIER_COLUMNS if c not in frame.columns]
    if missing:
        raise PlotError(f"the frontier needs the columns {', '.join(FRONTIER_COLUMNS)}; missing {', '.join(missing)}")
    data = frame.dropna(subset=["tok_s_per_user", "tok_s_per_gpu"]).copy()
    # A frame that also had a row without figures (a trial cut short) carries the flags as objects, where
    # ``~True`` is -2: booleans again, an unknown one a miss.
    data["meets_slo"] = data["meets_slo"].eq(True)
    if data.empty:
        raise PlotError("no config has a throughput and a TPOT to draw: every trial failed or was ruled out")
    reading = f", {clock.reading}" if clock is not None and clock.is_twin else ""
    # The frontier of what meets the SLO (of every point when none does): the trade a user can choose from.
    pool = data[data["meets_slo"]] if bool(data["meets_slo"].any()) else data
    data["on_frontier"] = False
    data.loc[pool.index, "on_frontier"] = pareto_front(pool)
    data["slo"] = data["meets_slo"].map({True: "meets the SLO", False: "misses the SLO"})
    x_title = f"interactivity: output tok/s per user (1000 / median TPOT{reading})"
    y_title = f"output throughput per GPU (tok/s{reading})"
    x_max = float(data["tok_s_per_user"].max()) * 1.1
    x = alt.X("tok_s_per_user:Q", title=x_title, scale=alt.Scale(domain=[0, x_max], nice=False))
    y = alt.Y("tok_s_per_gpu:Q", title=y_title, scale=alt.Scale(zero=True))
    tooltip = [
        alt.Tooltip("config:N"),
        *([alt.Tooltip("point:N", title="config")] if "point" in data.columns else []),
        alt.Tooltip("concurrency:Q"),
        alt.Tooltip("tok_s_per_user:Q", format=",.1f", title="tok/s per user"),
        alt.Tooltip("tok_s_per_gpu:Q", format=",.1f", title="tok/s per GPU"),
        alt.Tooltip("slo:N", title="SLO"),
    ]
    layers: list[Any] = []
    if tpot_limit_ms is not None and tpot_limit_ms > 0:
        cut = min(1000.0 / tpot_limit_ms, x_max)
        band = pd.DataFrame({"x0": [0.0], "x1": [cut], "what": [f"TPOT SLO missed (TPOT > {tpot_limit_ms:g} ms)"]})
        layers.append(
            alt.Chart(band)
            .mark_rect(opacity=0.12, color="#cf222e")
            .encode(x="x0:Q", x2="x1:Q", tooltip=[alt.Tooltip("what:N", title="shaded")])
        )
        layers.append(
            alt.Chart(band)
            .mark_text(align="left", baseline="top", dx=4, dy=4, color="#cf222e", fontSize=11)
            .encode(x="x0:Q", y=alt.value(0), text="what:N")
        )
    front = data[data["on_frontier"]].sort_values("tok_s_per_user")
    layers.append(
        alt.Chart(front)
        .mark_line(color="#57606a", strokeDash=[4, 3], point=False)
        .encode(x=x, y=y, order="tok_s_per_user:Q")
    )
    color = alt.Color("config:N", title="config")
    met, missed = data[data["meets_slo"]], data[~data["meets_slo"]]
    if not met.empty:
        layers.append(
            alt.Chart(met)
            .mark_point(size=70, filled=True, shape="circle")
            .encode(x=x, y=y, color=color, tooltip=tooltip)
        )
    if not missed.empty:
        layers.append(
            alt.Chart(missed)
            .mark_point(size=90, filled=False, shape="triangle-up", strokeWidth=2)
            .encode(x=x, y=y, color=color, tooltip=tooltip)
        )
    layers.append(
        alt.Chart(data).mark_text(dy=-10, fontSize=10, color="#57606a").encode(x=x, y=y, text="concurrency:Q")
    )
    if chosen is not None and (data["config"] == chosen).any():
        mark = data[data["config"] == chosen].nlargest(1, "tok_s_per_gpu").assign(label=f"{chosen} (chosen)")
        layers.append(
            alt.Chart(mark).mark_point(size=400, shape="circle", color="#1a7f37", strokeWidth=2.5).encode(x=x, y=y)
        )
        layers.append(
            alt.Chart(mark)
            .mark_text(align="right", dx=-14, dy=14, fontWeight="bold", color="#1a7f37")
            .encode(x=x, y=y, text="label:N")
        )
    subtitle = "each point a config at one concurrency (the number above it); dashed: the frontier"
    if not missed.empty:
        subtitle += " of the points within the SLO; hollow triangles miss an SLO"
    chart: alt.LayerChart = alt.layer(*layers).properties(
        width=WIDTH, height=320, title=alt.TitleParams(title, subtitle=[subtitle], anchor="start")
    )
    return chart
