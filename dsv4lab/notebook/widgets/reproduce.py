"""From a tweaked panel to a reproducible experiment: the panel's state as an experiment notebook's parameters.

An interactive tweak is not a result until it has run the way a report runs: headless, from parameters,
leaving a report. The experiment notebooks take flat parameters (``host``, ``target``, ``hardware``,
``sglang_version``, ``pace``, ``preset``, ``overrides``, ``concurrency``); the panel's config becomes
the preset it started from plus the difference as ``overrides`` (``"mem_fraction_static=0.6
cuda_graph_max_bs=16"``, dotted names for nested settings, ``none`` for unset), so the report shows the
same small diff the user made, not a wall of values. Only the parameters a notebook declares are passed.
The runner itself (:mod:`dsv4lab.notebook.nbrun`) is imported when the button is clicked.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dsv4lab import htmlview as hv
from dsv4lab.config.presets import PRESETS
from dsv4lab.config.server_config import ConfigDiff
from dsv4lab.notebook.experiment import overrides_text

__all__ = [
    "declared_parameters",
    "experiment_card",
    "experiment_notebooks",
    "experiment_parameters",
    "matching_notebook",
    "run_experiment",
]

#: Experiment notebooks are numbered steps: ``01_config_a_baseline.ipynb`` ... (``lab.ipynb`` is not one).
EXPERIMENT_GLOB = "[0-9][0-9]_*.ipynb"


def experiment_notebooks(folder: str | Path) -> list[Path]:
    """The numbered experiment notebooks in ``folder``, in step order."""
    return sorted(Path(folder).glob(EXPERIMENT_GLOB))


def matching_notebook(preset: str, notebooks: Sequence[Path]) -> Path | None:
    """The notebook named after ``preset`` (``config_b`` is not ``config_b_fixed``), else the first one."""
    longer = [other for other in PRESETS if other != preset and preset in other]
    for nb in notebooks:
        if preset in nb.stem and not any(other in nb.stem for other in longer):
            return nb
    return notebooks[0] if notebooks else None


def declared_parameters(notebook: str | Path) -> set[str] | None:
    """The names in the notebook's ``parameters`` cell (None when it cannot be read)."""
    try:
        import papermill

        return set(papermill.inspect_notebook(str(notebook)))
    except Exception:
        return None


def experiment_parameters(
    *,
    preset: str,
    changes: ConfigDiff,
    host: str,
    target: str,
    hardware: str,
    sglang_version: str,
    pace: float | None,
    concurrency: Sequence[int],
    declared: set[str] | None = None,
) -> dict[str, Any]:
    """The flat parameters of an experiment run of this config; only ``declared`` ones when given."""
    params: dict[str, Any] = {
        "host": host,
        "target": target,
        "hardware": hardware,
        "sglang_version": sglang_version,
        "pace": float(pace or 0.0),
        "preset": preset,
        "overrides": overrides_text(changes),
        "concurrency": [int(c) for c in concurrency],
    }
    if declared is not None:
        params = {k: v for k, v in params.items() if k in declared}
    return params


def run_experiment(notebook: Path, parameters: Mapping[str, Any], reports_root: str | Path) -> Any:
    """Run ``notebook`` headless with ``parameters`` (blocking: call it from a worker thread)."""
    from dsv4lab.notebook.nbrun import run_notebook  # type: ignore[import-not-found,unused-ignore]  # imported at click time

    return run_notebook(notebook, parameters, reports_root=reports_root)


def experiment_card(notebook: Path, parameters: Mapping[str, Any], run: Any) -> str:
    """The outcome of a run: ok or failed, and a link to its report."""
    ok = bool(getattr(run, "ok", False))
    report = Path(getattr(run, "report", "")) if getattr(run, "report", None) else None
    facts: list[tuple[str, object]] = [("notebook", notebook.name)]
    facts += [(k, v) for k, v in parameters.items()]
    if report is not None:
        try:
            href = os.path.relpath(report, Path.cwd())
        except ValueError:  # another drive (Windows)
            href = str(report)
        link = f"<a href='{html.escape(href, quote=True)}' target='_blank'>{html.escape(str(report))}</a>"
        facts.append(("report", hv.raw(link)))
    run_dir = getattr(run, "run_dir", None)
    if run_dir is not None:
        facts.append(("run dir", str(run_dir)))
    return hv.card(
        f"experiment {notebook.stem}", hv.kv_table(facts), state="ok" if ok else "fail", status="ok" if ok else "failed"
    )
