"""Sweeps: one notebook over a grid of parameters, each point its own run dir, one index with a table and a chart.

``run_sweep("04_config_b_fixed", {"mem_fraction_static": [0.55, 0.6, 0.65], "cuda_graph_max_bs": [8, 16, 32]})``
runs the notebook once per point. A grid key the notebook does not declare but that names a config field
(``mem_fraction_static``) is folded into the point's ``overrides``, so the same notebook sweeps any config
knob. Before each point the memory model predicts whether it fits; points predicted to run out of memory
are skipped (and shown as such) unless ``run_predicted_oom`` — a sweep should not spend a GPU host's hour
confirming what arithmetic already says.

A sweep's folder keeps each point's outcome (``sweep.json``), so ``run_sweep(..., resume=FOLDER)`` (``dsv4lab
sweep ... --resume FOLDER``) finishes it: points that ran to an outcome of their own are kept as they are, and
the points that did not — failed or interrupted runs, never-run points, and servers whose Slurm job the
scheduler ended (cancelled, timed out, preempted, node failure) — run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from dsv4lab.atomicfile import write_json_atomic
from dsv4lab.config.server_config import field_names
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, DSV4LabError, UnknownNameError
from dsv4lab.notebook.experiment import parse_overrides
from dsv4lab.notebook.nbrun import (
    check_hosts,
    check_parameters,
    find_notebook,
    new_run_dir,
    notebook_parameters,
    params_clock,
    run_host,
    run_notebook,
)
from dsv4lab.notebook.sidebyside import NotebookProcesses
from dsv4lab.resources import TEMPLATES
from dsv4lab.serving.slurm import SlurmPlacement

__all__ = [
    "SCHEDULER_ENDS",
    "SweepPoint",
    "SweepResult",
    "expand_grid",
    "figure_header",
    "held_text",
    "load_points",
    "run_sweep",
]


#: Slurm end states that say nothing about the point's config: a resumed sweep runs such a point again.
SCHEDULER_ENDS = frozenset({"CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "BOOT_FAIL", "DEADLINE"})


@dataclass
class SweepPoint:
    """One point of the grid: its parameters, what the memory model predicted, and how its run ended."""

    parameters: dict[str, Any]
    predicted: str = ""
    status: str = "pending"  # ok | failed | skipped
    run_dir: str | None = None
    report: str | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    #: For a point predicted not to fit: the memory model's first suggestion that does.
    suggestion: str = ""
    #: The shortfall the model predicts (GiB), for a point predicted not to fit.
    short_by_gib: float | None = None
    #: Its first server's time in the Slurm queue (s, wall clock) and its startup (s, on ``startup_clock``),
    #: from the run's ``readiness.json``; None where it had no queue or no verdict.
    queued_s: float | None = None
    startup_s: float | None = None
    startup_clock: str = ""
    #: The node(s) its first server's Slurm job ran on.
    nodes: str = ""
    #: How its first server's Slurm job ended when the scheduler ended it (CANCELLED, TIMEOUT, ...); "" otherwise.
    job_state: str = ""

    @property
    def finished(self) -> bool:
        """Whether the point ran to an outcome of its own: a resumed sweep keeps it rather than run it again."""
        return self.status == "ok" and self.job_state not in SCHEDULER_ENDS


@dataclass
class SweepResult:
    """A finished sweep: its points, what they share, and its ``index.html``."""

    notebook: str
    folder: Path
    index: Path
    points: list[SweepPoint]
    #: Every parameter the points share (the command's, the campaign's, the notebook's defaults).
    fixed: dict[str, Any] = field(default_factory=dict)
    #: The config the sweep varies: the preset and the changes every point applies.
    base: str = ""

    @property
    def keys(self) -> list[str]:
        """The swept parameters, in order."""
        return list(dict.fromkeys(k for p in self.points for k in p.parameters))

    @property
    def title(self) -> str:
        """What was swept over what: ``mem_fraction_static over config_b with cuda_graph_max_bs=16``."""
        what = ", ".join(self.keys) or "no parameter"
        return f"Sweep of {what} over {self.base}" if self.base else f"Sweep of {what} ({self.notebook})"

    def to_frame(self) -> pd.DataFrame:
        """One row per point: its grid values, the predicted fit, the outcome and the scalar figures."""
        rows = []
        for p in self.points:
            scalars = {k: v for k, v in p.figures.items() if isinstance(v, (int, float, str, bool)) or v is None}
            times = (
                {"node": p.nodes, "queued_s": p.queued_s, "startup_s": p.startup_s} if p.queued_s is not None else {}
            )
            rows.append({**p.parameters, "predicted": p.predicted, "status": p.status, **times, **scalars})
        frame: pd.DataFrame = pd.DataFrame(rows)
        return frame

    def table_rows(self) -> list[dict[str, str]]:
        """The index's table as text cells with units in the headers (what the terminal prints too)."""
        names = figure_columns(self.points)
        queued = any(p.queued_s is not None for p in self.points)
        clocks = list(dict.fromkeys(p.startup_clock for p in self.points if p.startup_clock and queued))
        rows = []
        for p in self.points:
            row = {k: _cell(p.parameters.get(k)) for k in self.keys}
            row["predicted"] = p.predicted
            row["outcome"] = p.status
            if queued:
                row["node"] = p.nodes or "–"
                row["queued (s, wall clock)"] = _cell(p.queued_s)
            if clocks:
                row[f"startup (s, {clocks[0]})"] = _cell(p.startup_s)
            for name in names:
                row[figure_header(name)] = _cell(p.figures.get(name), name)
            rows.append(row)
        return rows

    def text_table(self) -> str:
        """The table as aligned plain text, with the title and what was held fixed above it."""
        rows = self.table_rows()
        lines = [self.title, f"held fixed: {held_text(self.fixed)}"]
        if rows:
            cols = list(rows[0])
            width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}
            lines.append("  ".join(c.ljust(width[c]) for c in cols).rstrip())
            lines.extend("  ".join(r[c].ljust(width[c]) for c in cols).rstrip() for r in rows)
        lines.extend(self.notes())
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """What a reader should know about skipped points: by how much, and what the model suggests."""
        skipped = [p for p in self.points if p.status == "skipped"]
        if not skipped:
            return []
        shorts = [p.short_by_gib for p in skipped if p.short_by_gib is not None]
        by = f", short by {min(shorts):.1f} to {max(shorts):.1f} GiB" if shorts else ""
        out = [f"{plural(len(skipped), 'point')} skipped as predicted to run out of memory{by}."]
        hints = list(dict.fromkeys(p.suggestion for p in skipped if p.suggestion))
        if hints:
            out.append("The memory model suggests: " + "; ".join(hints) + ".")
        out.append("Run them anyway with --run-predicted-oom (run_predicted_oom=True in the library).")
        return out

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        body = hv.p(f"held fixed: {held_text(self.fixed)}") + hv.table(self.table_rows(), max_rows=30)
        body += "".join(hv.p(n) for n in self.notes()) + hv.p(f"index: {self.index}")
        bad = any(p.status == "failed" for p in self.points)
        return hv.card(self.title, body, state="fail" if bad else "ok")


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
    trust_host_key: bool = False,
    slurm: SlurmPlacement | None = None,
    max_parallel: int = 1,
    resume: str | Path | None = None,
) -> SweepResult:
    """Run ``notebook`` at every point of ``grid`` (or at each of ``points``, from :func:`load_points`);
    returns the result with ``index.html`` (see module doc). Every point's parameters and every host the
    points use are checked (the host connected to once) before the sweep's folder is made.

    With ``slurm`` every point's servers are Slurm jobs (the notebook's ``slurm`` parameter) and up to
    ``max_parallel`` points run at once: Slurm places them, and queues what does not fit now. Each point's
    queue time and startup are read from its run.

    ``resume`` names an earlier sweep's folder (of the same notebook and fixed parameters): its finished
    points are kept, the others run again into it (see the module doc)."""
    if (grid is None) == (points is None):
        raise ConfigError("sweep", "", "either a grid of values or a list of points")
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ConfigError("max_parallel", max_parallel, "a whole number >= 1")
    if max_parallel > 1 and slurm is None:
        raise ConfigError(
            "max_parallel",
            max_parallel,
            "1 without a Slurm placement (points on one host would share its GPUs); with --slurm-* Slurm "
            "places the points",
        )
    nb = find_notebook(notebook)
    declared = notebook_parameters(nb)
    fields = set(field_names())
    base = dict(parameters or {})
    if slurm is not None:
        if "slurm" not in declared:
            raise ConfigError("slurm", slurm.words(), f"a notebook with a slurm parameter ({nb.stem} has none)")
        base["slurm"] = slurm.to_text()
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
    hosts: dict[str, str] = {}
    for values in combos:
        host = run_host(nb, _point_parameters(base, values, declared))
        if host is not None:
            hosts.setdefault(host, f"sweep parameter host of {nb.stem}")
    check_hosts(hosts, trust_host_key=trust_host_key)
    swept = list(dict.fromkeys(k for c in combos for k in c))
    fixed = _fixed(base, declared, swept)
    base_text = _base_text(fixed, declared)
    previous: dict[str, SweepPoint] = {}
    if resume is not None:
        folder = Path(resume)
        previous = _previous_points(folder, nb.stem, fixed)
    else:
        folder = new_run_dir(Path(reports_root), f"sweep-{nb.stem}")
    results: list[SweepPoint] = []
    todo: list[tuple[SweepPoint, dict[str, Any]]] = []
    for values in combos:
        kept = previous.get(_point_key(values))
        if kept is not None and kept.finished:
            results.append(kept)
            continue
        params = _point_parameters(base, values, declared)
        predicted, short, hint = _predict(params, declared)
        point = SweepPoint(values, predicted=predicted, short_by_gib=short, suggestion=hint)
        results.append(point)
        if point.predicted.startswith("OOM") and not run_predicted_oom:
            point.status = "skipped"
            continue
        todo.append((point, params))

    def record(point: SweepPoint, run: Any) -> None:
        point.status = "ok" if run.ok else "failed"
        point.run_dir, point.report, point.figures = str(run.run_dir), str(run.report), dict(run.figures)
        point.queued_s, point.startup_s, point.startup_clock, point.nodes, point.job_state = _times(Path(run.run_dir))
        _write(nb, folder, results, fixed, base_text)

    if max_parallel == 1:
        for point, params in todo:
            run = run_notebook(
                nb, params, reports_root=folder, execution_timeout_s=execution_timeout_s, raise_on_error=False
            )
            record(point, run)
    else:
        _run_side_by_side(nb, todo, folder, execution_timeout_s, max_parallel, record)
    index = _write(nb, folder, results, fixed, base_text)
    return SweepResult(nb.stem, folder, index, results, fixed, base_text)


def _run_side_by_side(
    nb: Path,
    todo: Sequence[tuple[SweepPoint, dict[str, Any]]],
    folder: Path,
    execution_timeout_s: float,
    max_parallel: int,
    record: Any,
) -> None:
    """Up to ``max_parallel`` points at once (:class:`~dsv4lab.notebook.sidebyside.NotebookProcesses`). On Stop
    every running point is interrupted as a Ctrl-C would (its report is written) and its servers are stopped
    (their jobs cancelled); the finished points stay."""
    waiting = list(todo)
    procs: NotebookProcesses[SweepPoint] = NotebookProcesses(execution_timeout_s)
    try:
        while waiting or procs:
            while waiting and len(procs) < max_parallel:
                point, params = waiting.pop(0)
                procs.start(point, nb, params, new_run_dir(folder, nb.stem))
            for point, run in procs.finished():
                record(point, run)
    except KeyboardInterrupt:
        for point, run in procs.interrupt():
            point.status = "interrupted"
            point.run_dir, point.report = str(run.run_dir), str(run.report)
        raise


def _times(run_dir: Path) -> tuple[float | None, float | None, str, str, str]:
    """The first server's queue time, startup, clock, nodes and scheduler's end in a point's run (its
    earliest ``readiness.json``)."""
    import json

    found = sorted(run_dir.glob("**/readiness.json"), key=lambda p: p.stat().st_mtime)
    for path in found:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("verdict") in ("READY", "CRASHED", "STALLED", "TIMEOUT", "QUEUED"):
            clock = data.get("clock") or {}
            reading = str(clock.get("reading") or "wall clock")
            job = data.get("slurm") or {}
            nodes = ",".join(job.get("nodes") or [])
            state = str(job.get("state") or "")
            ended = state if state in SCHEDULER_ENDS else ""
            return data.get("queued_s"), data.get("elapsed_s"), reading, nodes, ended
    return None, None, "", "", ""


def _point_key(values: Mapping[str, Any]) -> str:
    import json

    return json.dumps(dict(values), sort_keys=True, default=str)


def _previous_points(folder: Path, notebook: str, fixed: Mapping[str, Any]) -> dict[str, SweepPoint]:
    """The points an earlier sweep in ``folder`` recorded, by their swept values; refused (before anything
    runs) when the folder holds no sweep of this notebook or its fixed parameters differ."""
    import json

    try:
        data = json.loads((folder / "sweep.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise ConfigError("--resume", str(folder), "a sweep's folder, with the sweep.json it wrote") from None
    if data.get("notebook") != notebook:
        raise ConfigError("--resume", str(folder), f"a sweep of {notebook} (that folder is {data.get('notebook')}'s)")
    held = json.loads(json.dumps(dict(fixed), default=str))
    differ = sorted(k for k in {*held, *data.get("fixed", {})} if held.get(k) != data.get("fixed", {}).get(k))
    if differ:
        raise ConfigError(
            "--resume",
            str(folder),
            "a sweep with the same fixed parameters (differing: " + ", ".join(differ) + "): start a new sweep",
        )
    points: dict[str, SweepPoint] = {}
    for record in data.get("runs") or []:
        known = {k: v for k, v in record.items() if k in SweepPoint.__dataclass_fields__}
        point = SweepPoint(**known)
        points[_point_key(point.parameters)] = point
    return points


def _point_parameters(base: dict[str, Any], values: Mapping[str, Any], declared: Mapping[str, Any]) -> dict[str, Any]:
    """The notebook's parameters for one point; config fields it does not declare go into ``overrides``."""
    merged = {**base, **values}
    params = {k: v for k, v in merged.items() if k in declared}
    folded = [f"{k}={v}" for k, v in merged.items() if k not in declared]
    if folded:
        params["overrides"] = " ".join([str(params.get("overrides", "")).strip(), *folded]).strip()
    return params


def _base_config(params: Mapping[str, Any], declared: Mapping[str, Any]) -> tuple[Any, str, str, str] | None:
    """The point's config, its hardware and release, when the notebook launches a preset."""
    if "preset" not in declared:
        return None
    from dsv4lab.config.presets import preset

    def default(name: str, fallback: str) -> str:
        raw = params.get(name, declared[name].default if name in declared else fallback)
        return str(raw).strip("\"'")

    name = default("preset", "config_a")
    config = preset(name).with_values(parse_overrides(str(params.get("overrides", ""))))
    return config, name, default("hardware", "rtx-pro-6000-x8"), default("sglang_version", "0.5.23")


def _predict(params: Mapping[str, Any], declared: Mapping[str, Any]) -> tuple[str, float | None, str]:
    """The memory model's verdict on the point's config (when the notebook launches a preset), the
    shortfall, and for a point that does not fit the first change the model predicts to fit."""
    from dsv4lab.model.memory import preflight, suggest

    try:
        found = _base_config(params, declared)
        if found is None:
            return "", None, ""
        config, _, hardware, release = found
        p = preflight(config, hardware, sglang_version=release)
    except DSV4LabError as exc:
        return f"invalid: {exc}", None, ""
    if p.fits:
        return f"fits ({p.min_headroom_gib:.1f} GiB to spare)", None, ""
    hint = ""
    with contextlib.suppress(DSV4LabError):
        options = suggest(config, hardware, sglang_version=release)
        if options:
            first = options[0]
            change = " ".join(f"{k}={v}" for k, v in first.changes.items())
            hint = f"{change} ({first.preflight.min_headroom_gib:.1f} GiB to spare)"
    return f"OOM, short by {p.short_by_gib or 0:.1f} GiB", p.short_by_gib, hint


def _fixed(base: Mapping[str, Any], declared: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """What every point shares: the notebook's defaults, overridden by the sweep's fixed parameters (config
    fields it folds into overrides included); the swept keys and the run dir are not fixed."""
    import ast

    out: dict[str, Any] = {}
    for name, p in declared.items():
        if name in keys or name == "run_dir":
            continue
        try:
            out[name] = ast.literal_eval(p.default)
        except (ValueError, SyntaxError):
            out[name] = p.default
    out.update({k: v for k, v in base.items() if k not in keys})
    return out


def _base_text(fixed: Mapping[str, Any], declared: Mapping[str, Any]) -> str:
    """``config_b with cuda_graph_max_bs=16``: the preset the points start from and the changes they share."""
    if "preset" not in declared:
        return ""
    changes = [f"{k}={v}" for k, v in fixed.items() if k not in declared]
    overrides = str(fixed.get("overrides", "") or "").strip()
    if overrides:
        changes.insert(0, overrides)
    preset = str(fixed.get("preset", "config_a"))
    return preset + (f" with {' '.join(changes)}" if changes else "")


def held_text(fixed: Mapping[str, Any]) -> str:
    """The fixed parameters in one line (empty values left out)."""
    shown = [f"{k}={_held(k, v)}" for k, v in fixed.items() if v not in ("", None, [])]
    return ", ".join(shown) or "nothing"


def _held(name: str, value: Any) -> Any:
    """A fixed value as a reader wants it: a Slurm placement in words (``partition gpu: 1 node x 8 GPUs,
    10 min``), not the JSON the notebooks are passed."""
    if name == "slurm" and isinstance(value, str):
        with contextlib.suppress(DSV4LabError):
            placement = SlurmPlacement.parse(value)
            if placement is not None:
                return placement.words()
    return value


#: Units of the figures notebooks record, by name ending (a figure a sweep shows must say its unit).
_UNITS = (("_tok_s", "tok/s"), ("_gib", "GiB"), ("_ms", "ms"), ("_s", "s"), ("_share", "%"))


def figure_header(name: str) -> str:
    """A figure's column header with its unit: ``output_throughput_c16`` -> ``output tok/s at C=16``."""
    if name.startswith("output_throughput_c"):
        return f"output tok/s at C={name.rsplit('_c', 1)[1]}"
    words = name.replace("_", " ")
    for suffix, unit in _UNITS:
        if name.endswith(suffix):
            return f"{name[: -len(suffix)].replace('_', ' ')} ({unit})"
    return words


def figure_columns(points: Sequence[SweepPoint]) -> list[str]:
    """The scalar figures any point recorded, in first-seen order (texts longer than a cell left out)."""
    names: dict[str, None] = {}
    for p in points:
        for k, v in p.figures.items():
            if isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= 40):
                names.setdefault(k)
    return list(names)


def _cell(value: Any, name: str = "") -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if name.endswith("_share"):
            return f"{value:.0%}"
        return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _write(nb: Path, folder: Path, points: Sequence[SweepPoint], fixed: Mapping[str, Any], base: str) -> Path:
    """``index.html`` (a table and a chart) and ``sweep.json`` for the points so far."""
    import jinja2

    from dsv4lab.plots import to_svg

    result = SweepResult(nb.stem, folder, folder / "index.html", list(points), dict(fixed), base)
    frame = result.to_frame()
    write_json_atomic(
        folder / "sweep.json",
        {
            "notebook": nb.stem,
            "title": result.title,
            "swept": result.keys,
            "fixed": dict(fixed),
            "base": base,
            "points": frame.to_dict("records"),
            "notes": result.notes(),
            # Each point as recorded, for a resumed sweep (run_sweep(resume=...)).
            "runs": [dataclasses.asdict(p) for p in points],
        },
    )
    chart_svg = ""
    metric = _metric(frame)
    keys = result.keys
    if metric and keys:
        chart_svg = to_svg(_chart(frame, keys, metric, result.title))
    frontier_svg = _frontier_svg(points, fixed)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True)
    cells = result.table_rows()
    rows: list[dict[str, Any]] = []
    for p, row in zip(points, cells, strict=True):
        report = str(Path(p.report).relative_to(folder)) if p.report else None
        rows.append({"cells": row, "status": p.status, "report": report})
    session_clock = params_clock({"target": "", **fixed})
    clock = session_clock.note() if session_clock.is_twin else ""
    page = env.get_template("sweep_index.html.j2").render(
        title=result.title,
        notebook=nb.stem,
        held=held_text(fixed),
        columns=list(cells[0]) if cells else [],
        rows=rows,
        chart_svg=chart_svg,
        frontier_svg=frontier_svg,
        notes=result.notes(),
        clock=clock,
    )
    from dsv4lab.atomicfile import write_text_atomic
    from dsv4lab.notebook.report import public_html

    return write_text_atomic(folder / "index.html", public_html(page, [folder]))  # shared like a report


def _frontier_svg(points: Sequence[SweepPoint], fixed: Mapping[str, Any]) -> str:
    """The Pareto frontier of the points' benchmarks (each point a config, named by its swept values), as inline
    SVG; empty when no point measured a TPOT."""
    from dsv4lab.notebook.experiment import read_results
    from dsv4lab.notebook.measurements import Measurement, frontier_rows
    from dsv4lab.plots import to_svg
    from dsv4lab.plots.frontier import frontier_chart

    found: list[Measurement] = []
    for p in points:
        if not p.run_dir:
            continue
        name = " ".join(f"{k}={v}" for k, v in p.parameters.items())
        with contextlib.suppress(DSV4LabError):
            for item in read_results(p.run_dir).get("measurements", []):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    found.append(dataclasses.replace(Measurement.from_dict(item), config=name))
    rows = frontier_rows(found)
    if not rows:
        return ""
    clock = params_clock({"target": "", **fixed})
    return to_svg(
        frontier_chart(pd.DataFrame(rows), clock=clock, title="Every point: throughput per GPU against interactivity")
    )


def _metric(frame: pd.DataFrame) -> str | None:
    """The figure the chart shows: the highest-concurrency output throughput the points recorded."""
    names = [c for c in frame.columns if str(c).startswith("output_throughput_c")]
    if not names:
        return None
    return max(names, key=lambda c: int(str(c).rsplit("_c", 1)[1]))


def _chart(frame: pd.DataFrame, keys: Sequence[str], metric: str, title: str) -> Any:
    data = frame.copy()
    data["outcome"] = [
        "skipped: predicted OOM" if s == "skipped" else ("ran" if s == "ok" else "failed") for s in data["status"]
    ]
    data[metric] = pd.to_numeric(data.get(metric), errors="coerce").fillna(0.0)
    x = alt.X(f"{keys[0]}:O", title=keys[0])
    encodings: dict[str, Any] = {"x": x, "y": alt.Y(f"{metric}:Q", title=figure_header(metric))}
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
        title={"text": title, "subtitle": "faded: not run (predicted OOM) or failed"},
        width=520,
        height=260,
    )
