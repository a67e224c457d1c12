"""Sweeps: one notebook over a grid of parameters, each point its own run dir, one index with a table and a chart.

``run_sweep("04_config_b_fixed", {"mem_fraction_static": [0.55, 0.6, 0.65], "cuda_graph_max_bs": [8, 16, 32]})``
runs the notebook once per point. A grid key the notebook does not declare but that names a config field
(``mem_fraction_static``) is folded into the point's ``overrides``, so the same notebook sweeps any config
knob. Before each point the memory model predicts whether it fits; points predicted to run out of memory
are skipped (and shown as such) unless ``run_predicted_oom`` — a sweep should not spend a GPU host's hour
confirming what arithmetic already says.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from dsv4lab.config import field_names
from dsv4lab.errors import ConfigError, DSV4LabError, UnknownNameError
from dsv4lab.experiment import parse_overrides, write_json_atomic
from dsv4lab.nbrun import check_parameters, find_notebook, new_run_dir, notebook_parameters, run_notebook

__all__ = ["SweepPoint", "SweepResult", "expand_grid", "load_points", "run_sweep"]


@dataclass
class SweepPoint:
    parameters: dict[str, Any]
    predicted: str = ""
    status: str = "pending"  # ok | failed | skipped
    run_dir: str | None = None
    report: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass
class SweepResult:
    notebook: str
    folder: Path
    index: Path
    points: list[SweepPoint]

    def to_frame(self) -> pd.DataFrame:
        """One row per point: its grid values, the predicted fit, the outcome and the scalar figures."""
        rows = []
        for p in self.points:
            scalars = {k: v for k, v in p.figures.items() if isinstance(v, (int, float, str, bool)) or v is None}
            rows.append({**p.parameters, "predicted": p.predicted, "status": p.status, **scalars})
        frame: pd.DataFrame = pd.DataFrame(rows)
        return frame

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        records = [{str(k): v for k, v in row.items()} for row in self.to_frame().to_dict("records")]
        table = hv.table(records, max_rows=30)
        return hv.card(f"sweep of {self.notebook}", table + hv.p(f"index: {self.index}"))


def expand_grid(grid: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values, in the grid's key order."""
    keys = list(grid)
    for k in keys:
        if not isinstance(grid[k], (list, tuple)) or not grid[k]:
            raise ConfigError(f"sweep parameter {k}", grid[k], "one or more values, e.g. 0.55,0.6,0.65")
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(grid[k] for k in keys))]


def load_points(path: str | Path) -> list[dict[str, Any]]:
    """Sweep points from a TOML file: ``[[point]]`` tables, each a set of parameter values (any combination,
    where a grid would be wasteful or a few hand-picked configs are the question)."""
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    p = Path(path).expanduser()
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError: not TOML, or not UTF-8 text at all
        raise ConfigError("points", str(p), "a readable TOML file with [[point]] tables", detail=str(exc)) from exc
    points = data.get("point")
    if not isinstance(points, list) or not points or not all(isinstance(x, dict) and x for x in points):
        raise ConfigError("points", str(p), "one or more [[point]] tables, e.g. mem_fraction_static = 0.6")
    return [dict(x) for x in points]


def run_sweep(
    notebook: str | Path,
    grid: Mapping[str, Sequence[Any]] | None = None,
    *,
    points: Sequence[Mapping[str, Any]] | None = None,
    parameters: Mapping[str, Any] | None = None,
    reports_root: str | Path = "reports",
    run_predicted_oom: bool = False,
    execution_timeout_s: float = 3600.0,
) -> SweepResult:
    """Run ``notebook`` at every point of ``grid`` (or at each of ``points``, from :func:`load_points`);
    returns the result with ``index.html`` (see module doc)."""
    if (grid is None) == (points is None):
        raise ConfigError("sweep", "", "either a grid of values or a list of points")
    nb = find_notebook(notebook)
    declared = notebook_parameters(nb)
    fields = set(field_names())
    base = dict(parameters or {})
    combos = expand_grid(grid) if grid is not None else [dict(p) for p in points or ()]
    for key in sorted({k for c in combos for k in c} | set(base)):
        if key not in declared and not (key in fields and "overrides" in declared):
            known = [*declared, *(sorted(fields) if "overrides" in declared else ())]
            raise UnknownNameError(
                "sweep parameter", key, known, field=f"sweep parameter {key} of {nb.stem}", where=f" of {nb.stem}"
            )
    for values in combos:  # every point checked before the first runs: a bad value in the last is refused now
        try:
            check_parameters(nb, _point_parameters(base, values, declared))
        except ConfigError as exc:
            where = " ".join(f"{k}={v}" for k, v in values.items())
            raise exc.within(f"sweep point {where}: ") from None
    folder = new_run_dir(Path(reports_root), f"sweep-{nb.stem}")
    results: list[SweepPoint] = []
    for values in combos:
        params = _point_parameters(base, values, declared)
        point = SweepPoint(values, predicted=_predict(params, declared))
        results.append(point)
        if point.predicted.startswith("OOM") and not run_predicted_oom:
            point.status = "skipped"
            continue
        run = run_notebook(
            nb, params, reports_root=folder, execution_timeout_s=execution_timeout_s, raise_on_error=False
        )
        point.status = "ok" if run.ok else "failed"
        point.run_dir, point.report, point.figures = str(run.run_dir), str(run.report), dict(run.figures)
        _write(nb, folder, results)
    index = _write(nb, folder, results)
    return SweepResult(nb.stem, folder, index, results)


def _point_parameters(base: dict[str, Any], values: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook's parameters for one point; config fields it does not declare go into ``overrides``."""
    merged = {**base, **values}
    params = {k: v for k, v in merged.items() if k in declared}
    folded = [f"{k}={v}" for k, v in merged.items() if k not in declared]
    if folded:
        params["overrides"] = " ".join([str(params.get("overrides", "")).strip(), *folded]).strip()
    return params


def _predict(params: Mapping[str, Any], declared: Mapping[str, Any]) -> str:
    """The memory model's verdict on the point's config, when the notebook launches a preset."""
    if "preset" not in declared:
        return ""
    from dsv4lab.memory import preflight
    from dsv4lab.presets import preset

    def default(name: str, fallback: str) -> str:
        raw = params.get(name, declared[name].default if name in declared else fallback)
        return str(raw).strip("\"'")

    try:
        config = preset(default("preset", "config_a")).with_values(parse_overrides(str(params.get("overrides", ""))))
        p = preflight(
            config, default("hardware", "rtx-pro-6000-x8"), sglang_version=default("sglang_version", "0.5.23")
        )
    except DSV4LabError as exc:
        return f"invalid: {exc}"
    return f"fits ({p.min_headroom_gib:.1f} GiB to spare)" if p.fits else f"OOM, short by {p.short_by_gib or 0:.1f} GiB"


def _write(nb: Path, folder: Path, points: Sequence[SweepPoint]) -> Path:
    """``index.html`` (a table and a chart) and ``sweep.json`` for the points so far."""
    import jinja2

    from dsv4lab.plots import to_svg

    result = SweepResult(nb.stem, folder, folder / "index.html", list(points))
    frame = result.to_frame()
    write_json_atomic(folder / "sweep.json", {"notebook": nb.stem, "points": frame.to_dict("records")})
    chart_svg = ""
    metric = _metric(frame)
    keys = list(points[0].parameters) if points else []
    if metric and keys:
        chart_svg = to_svg(_chart(frame, keys, metric))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "templates")), autoescape=True)
    rows: list[dict[str, Any]] = []
    for p in points:
        scalars = {k: v for k, v in p.figures.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        report = str(Path(p.report).relative_to(folder)) if p.report else None
        rows.append(
            {"values": p.parameters, "predicted": p.predicted, "status": p.status, "report": report, "figures": scalars}
        )
    figure_names = sorted({k for p in points for k, v in p.figures.items() if isinstance(v, (int, float))})
    page = env.get_template("sweep_index.html.j2").render(
        notebook=nb.stem, keys=keys, rows=rows, figure_names=figure_names, chart_svg=chart_svg, metric=metric
    )
    from dsv4lab.atomicfile import write_text_atomic
    from dsv4lab.report import public_html

    return write_text_atomic(folder / "index.html", public_html(page, [folder]))  # shared like a report


def _metric(frame: pd.DataFrame) -> str | None:
    """The figure the chart shows: the highest-concurrency output throughput the points recorded."""
    names = [c for c in frame.columns if str(c).startswith("output_throughput_c")]
    if not names:
        return None
    return max(names, key=lambda c: int(str(c).rsplit("_c", 1)[1]))


def _chart(frame: pd.DataFrame, keys: Sequence[str], metric: str) -> Any:
    data = frame.copy()
    data["outcome"] = [
        "skipped: predicted OOM" if s == "skipped" else ("ran" if s == "ok" else "failed") for s in data["status"]
    ]
    data[metric] = pd.to_numeric(data.get(metric), errors="coerce").fillna(0.0)
    x = alt.X(f"{keys[0]}:O", title=keys[0])
    encodings: dict[str, Any] = {"x": x, "y": alt.Y(f"{metric}:Q", title=f"{metric.replace('_', ' ')} (tok/s)")}
    if len(keys) > 1:
        encodings["xOffset"] = alt.XOffset(f"{keys[1]}:O", title=keys[1])
        encodings["color"] = alt.Color(f"{keys[1]}:O", title=keys[1])
    chart = (
        alt.Chart(data)
        .mark_bar()
        .encode(**encodings, opacity=alt.condition("datum.outcome == 'ran'", alt.value(1.0), alt.value(0.3)))
    )
    text = (
        alt.Chart(data)
        .mark_text(dy=-6, fontSize=10)
        .encode(x=x, **({"xOffset": encodings["xOffset"]} if len(keys) > 1 else {}), y=encodings["y"], text="outcome:N")
    )
    return (chart + text).properties(
        title={"text": f"Sweep of {', '.join(keys)}", "subtitle": "faded: not run (predicted OOM) or failed"},
        width=520,
        height=260,
    )
