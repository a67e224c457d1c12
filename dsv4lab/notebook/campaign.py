"""A campaign: the experiment notebooks in order, each step's results handed to the next, one index page.

A campaign file (TOML; the story's is shipped as ``dsv4lab/campaigns/story.toml``) names parameters for
every notebook, the steps, and what the index shows. Each step runs with
:func:`~dsv4lab.notebook.nbrun.run_notebook` into ``reports/<campaign>/<time>-<notebook>/``; its ``inputs`` take
parameters from earlier steps' ``results.json`` (a run dir, a chosen fix). A server that fails as the
story says is the notebook's result, and the campaign goes on; a notebook that raises stops the campaign,
and the index still shows how far it got. A rerun skips the steps that already finished with the same
parameters (``force`` reruns them), so an interrupted campaign resumes where it stopped.

On a Slurm placement (``slurm``, or the campaign parameter ``slurm``) ``max_parallel`` above 1 runs steps side
by side: a step starts as soon as the steps its inputs name have finished, up to ``max_parallel`` at once, and
Slurm decides which of their servers start now and which wait in its queue. The story's config A, config B and
kernel profile need nothing from each other; its diagnosis waits for config B. The index, ``campaign.json``
and the reports are the same as in order, steps listed in the file's order.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import hashlib
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4lab import htmlview as hv
from dsv4lab.atomicfile import write_json_atomic, write_text_atomic
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError, Interrupted, NotebookError, UnknownNameError
from dsv4lab.notebook.campaignlock import campaign_lock
from dsv4lab.notebook.experiment import read_results
from dsv4lab.notebook.measurements import Measurement, by_config
from dsv4lab.notebook.nbrun import (
    NotebookRun,
    check_hosts,
    check_parameters,
    environment,
    find_notebook,
    new_run_dir,
    notebook_parameters,
    params_clock,
    run_host,
    run_notebook,
    target_provenance,
)
from dsv4lab.notebook.report import public_html
from dsv4lab.notebook.sidebyside import NotebookProcesses
from dsv4lab.resources import CAMPAIGNS, TEMPLATES
from dsv4lab.serving.slurm import SlurmPlacement
from dsv4lab.units import fmt_tok_s

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = [
    "DEFAULT_CAMPAIGN",
    "Campaign",
    "CampaignResult",
    "CampaignStep",
    "campaign_hosts",
    "check_campaign",
    "load_campaign",
    "rerender_index",
    "run_campaign",
]

#: The campaign ``dsv4lab campaign`` and ``make demo`` run when no file is named: the story's.
DEFAULT_CAMPAIGN = CAMPAIGNS / "story.toml"
STATE_FILE = "campaign.json"


@dataclass(frozen=True)
class CampaignStep:
    """One notebook of the campaign, its own parameters, and parameters taken from earlier steps."""

    id: str
    notebook: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    inputs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Campaign:
    """A campaign file, checked: its parameters, its steps in order, and what its index shows."""

    name: str
    title: str
    parameters: Mapping[str, Any]
    steps: tuple[CampaignStep, ...]
    index: Mapping[str, Any] = field(default_factory=dict)
    source: Path | None = None

    def with_parameters(self, overrides: Mapping[str, Any]) -> Campaign:
        """The same campaign with campaign-wide parameters changed (``-p time_scale 0.02``, ``-p host gpubox``)."""
        return Campaign(self.name, self.title, {**self.parameters, **overrides}, self.steps, self.index, self.source)


def load_campaign(path: str | Path | None = None) -> Campaign:
    """Read a campaign file (default: the story's). Every step's notebook must exist and every named
    parameter must be one the notebook declares — checked here, before anything runs."""
    source = Path(path).expanduser() if path is not None else DEFAULT_CAMPAIGN
    try:
        data = tomllib.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError("campaign", str(source), "a readable campaign .toml file", detail=exc.strerror or "") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError("campaign", str(source), "valid TOML", detail=str(exc)) from exc
    head = data.get("campaign", {})
    name = str(head.get("name") or source.stem)
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError("campaign.name", name, "letters, digits, '-' and '_' (it names the reports folder)")
    raw_steps = data.get("step")
    if not isinstance(raw_steps, list) or not raw_steps:
        raise ConfigError("campaign.step", raw_steps, "one or more [[step]] tables with id and notebook")
    steps: list[CampaignStep] = []
    for i, raw in enumerate(raw_steps):
        if not isinstance(raw, dict) or "notebook" not in raw:
            raise ConfigError(
                f"step {i + 1}", raw, "a table with notebook = ... (and optionally id, parameters, inputs)"
            )
        nb = find_notebook(_relative(source, str(raw["notebook"])))
        step = CampaignStep(
            id=str(raw.get("id") or nb.stem),
            notebook=str(nb),
            parameters=dict(raw.get("parameters") or {}),
            inputs={str(k): str(v) for k, v in (raw.get("inputs") or {}).items()},
        )
        declared = notebook_parameters(nb)
        for key in (*step.parameters, *step.inputs):
            if key not in declared:
                where = f" of {nb.stem}"
                raise UnknownNameError("parameter", key, declared, field=f"parameter {key}{where}", where=where).within(
                    f"step {step.id}: "
                )
        earlier = {s.id for s in steps}
        for key, ref in step.inputs.items():
            if ref.split(".", 1)[0] not in earlier:
                raise UnknownNameError(
                    "earlier step",
                    ref.split(".", 1)[0],
                    [s.id for s in steps],
                    field=f"input {key}",
                    where=f" in {ref!r} (inputs are <earlier step>.<figure>)",
                ).within(f"step {step.id}: ")
        steps.append(step)
    if len({s.id for s in steps}) != len(steps):
        raise ConfigError("campaign.step.id", [s.id for s in steps], "distinct step ids")
    return Campaign(
        name=name,
        title=str(head.get("title") or name),
        parameters=dict(data.get("parameters") or {}),
        steps=tuple(steps),
        index=dict(data.get("index") or {}),
        source=source,
    )


def check_campaign(campaign: Campaign) -> None:
    """Every parameter of every step checked as its run will check it (:func:`~dsv4lab.notebook.nbrun.check_parameters`:
    types, and what the values name), and every campaign-wide parameter used by some step — so a typo in
    step 5 fails now, not after an hour of steps 1 to 4. Inputs from earlier steps are checked when known."""
    used: set[str] = set()
    for step in campaign.steps:
        declared = notebook_parameters(step.notebook)
        used |= set(declared)
        params = {k: v for k, v in campaign.parameters.items() if k in declared}
        params.update({k: v for k, v in step.parameters.items() if k not in step.inputs})
        try:
            check_parameters(step.notebook, params)
        except ConfigError as exc:
            raise exc.within(f"step {step.id}: ") from None
    unused = sorted(set(campaign.parameters) - used)
    if unused:
        raise UnknownNameError(
            "campaign parameter",
            unused[0],
            sorted(used),
            field=f"campaign parameter {unused[0]}",
            where=" (a campaign parameter must be one its notebooks declare)",
        )


def campaign_hosts(campaign: Campaign) -> dict[str, str]:
    """The hosts the steps will open, each with where it first appears (for an error naming it)."""
    hosts: dict[str, str] = {}
    for step in campaign.steps:
        declared = notebook_parameters(step.notebook)
        params = {k: v for k, v in {**campaign.parameters, **step.parameters}.items() if k in declared}
        host = run_host(step.notebook, params)
        if host is not None:
            source = "step" if "host" in step.parameters else "campaign"
            where = f"step {step.id}: parameter host" if source == "step" else "campaign parameter host"
            hosts.setdefault(host, where)
    return hosts


def _relative(source: Path, notebook: str) -> str:
    """A notebook path relative to the campaign file, or the name of a shipped notebook."""
    candidate = source.parent / notebook
    return str(candidate) if candidate.suffix == ".ipynb" and candidate.exists() else notebook


@dataclass
class StepState:
    id: str
    notebook: str
    status: str  # ok | failed | interrupted | skipped
    run_dir: str | None = None
    report: str | None = None
    error: str | None = None
    reused: bool = False
    duration_s: float = 0.0
    figures: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class CampaignResult:
    """Where a campaign run left its steps and its ``index.html``, and how each step ended."""

    campaign: Campaign
    folder: Path
    index: Path
    steps: list[StepState]

    @property
    def ok(self) -> bool:
        return all(s.status == "ok" for s in self.steps) and len(self.steps) == len(self.campaign.steps)

    def _repr_html_(self) -> str:
        rows = [
            {
                "step": s.id,
                "notebook": Path(s.notebook).stem,
                "status": s.status + (" (reused)" if s.reused else ""),
                "report": s.report,
            }
            for s in self.steps
        ]
        return hv.card(
            f"campaign {self.campaign.name}",
            hv.table(rows) + hv.p(f"index: {self.index}"),
            state="ok" if self.ok else "fail",
        )


def run_campaign(
    campaign: Campaign,
    *,
    reports_root: str | Path = "reports",
    force: bool = False,
    execution_timeout_s: float = 3600.0,
    log_output: bool = False,
    on_step: Any = None,
    trust_host_key: bool = False,
    slurm: SlurmPlacement | None = None,
    max_parallel: int = 1,
) -> CampaignResult:
    """Run the steps in order, or side by side on a Slurm placement (see module doc); returns the result, with
    ``index.html`` written.

    ``slurm`` sets the campaign parameter of the same name (every step's servers are Slurm jobs). Raises
    :class:`NotebookError` (after writing the index) when a notebook failed, and before anything runs
    :class:`~dsv4lab.errors.ConfigError` for a ``max_parallel`` other than 1 without a Slurm placement,
    :class:`~dsv4lab.errors.HostError` when a step's host cannot be reached (``trust_host_key`` records an
    unknown key) or :class:`~dsv4lab.errors.LaunchError` when another campaign holds the host or the folder
    (:mod:`dsv4lab.notebook.campaignlock`).
    """
    if slurm is not None:
        campaign = campaign.with_parameters({"slurm": slurm.to_text()})
    if isinstance(max_parallel, bool) or not isinstance(max_parallel, int) or max_parallel < 1:
        raise ConfigError("max_parallel", max_parallel, "a whole number >= 1")
    if max_parallel > 1 and not campaign.parameters.get("slurm"):
        raise ConfigError(
            "max_parallel",
            max_parallel,
            "1 without a Slurm placement (steps on one host would share its GPUs); with --slurm-* (or the "
            "campaign parameter slurm) Slurm places the steps' servers",
        )
    check_campaign(campaign)  # every step's parameters, before a folder is made or a kernel starts
    check_hosts(campaign_hosts(campaign), trust_host_key=trust_host_key)  # and every host, connected to once
    folder = Path(reports_root).resolve() / campaign.name
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    host = str(campaign.parameters.get("host") or "local")
    with campaign_lock(campaign.name, folder, host):
        if max_parallel > 1:
            return _run_side_by_side(campaign, folder, force, execution_timeout_s, log_output, on_step, max_parallel)
        return _run_steps(campaign, folder, force, execution_timeout_s, log_output, on_step)


def _run_steps(
    campaign: Campaign, folder: Path, force: bool, execution_timeout_s: float, log_output: bool, on_step: Any
) -> CampaignResult:
    previous = _load_state(folder)
    states: list[StepState] = []
    figures: dict[str, dict[str, Any]] = {}
    failure: NotebookError | None = None
    stopped: Interrupted | None = None
    started = time.monotonic()
    try:
        for step in campaign.steps:
            params = _step_parameters(campaign, step, figures)
            digest = _digest(step.notebook, params)
            done = _reusable(previous.get(step.id), digest, force)
            if done is not None:
                state = _reused(step, done)
            else:
                if on_step is not None:
                    on_step(step)
                run: NotebookRun | None
                try:
                    run = run_notebook(
                        step.notebook,
                        params,
                        reports_root=folder,
                        execution_timeout_s=execution_timeout_s,
                        log_output=log_output,
                    )
                except NotebookError as exc:
                    failure = exc
                    run = exc.run
                except Interrupted as exc:  # recorded as interrupted: a rerun does this step again
                    stopped = exc
                    run = exc.partial if isinstance(exc.partial, NotebookRun) else None
                state = _state(step, run)
                if stopped is not None:
                    state.status = "interrupted"
            states.append(state)
            figures[step.id] = {**state.figures, "run_dir": state.run_dir}
            previous[step.id] = {
                "digest": digest,
                "status": state.status,
                "run_dir": state.run_dir,
                "report": state.report,
            }
            _save_state(folder, campaign, previous, [s.id for s in states])
            if failure is not None or stopped is not None:
                break
    finally:
        index = write_index(campaign, folder, states)
    return _ended(campaign, folder, index, states, failure, stopped, started)


def _ended(
    campaign: Campaign,
    folder: Path,
    index: Path,
    states: list[StepState],
    failure: NotebookError | None,
    stopped: Interrupted | None,
    started: float,
) -> CampaignResult:
    """The result, or the Stop or failure that ended the campaign raised with the result in it."""
    result = CampaignResult(campaign, folder, index, states)
    if stopped is not None:
        finished = sum(s.status == "ok" for s in states)
        raise Interrupted(
            f"campaign {campaign.name}",
            result,
            after=f"after {finished} of {plural(len(campaign.steps), 'step')}",
            elapsed_s=time.monotonic() - started,
            note=f"index: {index}",
        )
    if failure is not None:
        raise NotebookError(f"campaign {campaign.name} stopped: {failure}; index: {index}", result)
    return result


def _run_side_by_side(
    campaign: Campaign,
    folder: Path,
    force: bool,
    execution_timeout_s: float,
    log_output: bool,
    on_step: Any,
    max_parallel: int,
) -> CampaignResult:
    """Each step as soon as the steps its inputs name are ``ok``, up to ``max_parallel`` at once, each in a
    process of its own (:class:`~dsv4lab.notebook.sidebyside.NotebookProcesses`). A failed step starts nothing
    new and lets the running ones finish; a Stop interrupts every running step (each report is written, each
    server's job cancelled)."""
    previous = _load_state(folder)
    done: dict[str, StepState] = {}
    figures: dict[str, dict[str, Any]] = {}
    failure: NotebookError | None = None
    stopped: Interrupted | None = None
    started = time.monotonic()
    waiting = list(campaign.steps)
    procs: NotebookProcesses[tuple[CampaignStep, str]] = NotebookProcesses(execution_timeout_s, log_output=log_output)

    def finish(step: CampaignStep, digest: str, state: StepState) -> None:
        done[step.id] = state
        figures[step.id] = {**state.figures, "run_dir": state.run_dir}
        previous[step.id] = {"digest": digest, "status": state.status, "run_dir": state.run_dir, "report": state.report}
        _save_state(folder, campaign, previous, [s.id for s in campaign.steps if s.id in done])

    try:
        while True:
            for step in list(waiting) if failure is None else []:
                if len(procs) >= max_parallel:
                    break
                if any(done.get(need) is None or done[need].status != "ok" for need in _needs(step)):
                    continue
                waiting.remove(step)
                params = _step_parameters(campaign, step, figures)
                digest = _digest(step.notebook, params)
                reuse = _reusable(previous.get(step.id), digest, force)
                if reuse is not None:
                    finish(step, digest, _reused(step, reuse))
                    continue
                if on_step is not None:
                    on_step(step)
                procs.start((step, digest), Path(step.notebook), params, new_run_dir(folder, Path(step.notebook).stem))
            if not procs:
                break
            for (step, digest), run in procs.finished():
                finish(step, digest, _state(step, run))
                if not run.ok and failure is None:
                    where = f"; report: {run.report}#papermill-error-cell" if run.report else ""
                    failure = NotebookError(f"notebook {Path(step.notebook).stem} failed: {run.error}{where}", run)
    except KeyboardInterrupt:
        for (step, digest), run in procs.interrupt():
            state = _state(step, run)
            state.status = "interrupted"
            finish(step, digest, state)
        stopped = Interrupted(f"campaign {campaign.name}", None)
    finally:
        states = [done[s.id] for s in campaign.steps if s.id in done]
        index = write_index(campaign, folder, states)
    return _ended(campaign, folder, index, states, failure, stopped, started)


def _needs(step: CampaignStep) -> set[str]:
    """The earlier steps whose results this step's inputs name."""
    return {ref.split(".", 1)[0] for ref in step.inputs.values()}


def _reusable(done: Mapping[str, Any] | None, digest: str, force: bool) -> Mapping[str, Any] | None:
    """A step's earlier run when it can stand (it finished ok, with the same notebook and parameters, and its
    run dir is still there); None when the step runs again."""
    if force or not done or done.get("digest") != digest or done.get("status") != "ok":
        return None
    return done if Path(done["run_dir"]).is_dir() else None


def _step_parameters(
    campaign: Campaign, step: CampaignStep, figures: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    declared = notebook_parameters(step.notebook)
    params = {k: v for k, v in campaign.parameters.items() if k in declared}
    params.update(step.parameters)
    for key, ref in step.inputs.items():
        source, _, name = ref.partition(".")
        value = figures.get(source, {}).get(name)
        if value is None:
            raise UnknownNameError(
                f"figure of step {source}", name, sorted(figures.get(source, {})), field=f"input {key}"
            ).within(f"step {step.id}: ")
        params[key] = value
    return params


def _digest(notebook: str, params: Mapping[str, Any]) -> str:
    """What decides whether a finished step can be reused: the notebook's content and the parameters."""
    h = hashlib.sha256(Path(notebook).read_bytes())
    h.update(json.dumps(params, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def _state(step: CampaignStep, run: NotebookRun | None) -> StepState:
    if run is None:
        return StepState(step.id, step.notebook, "failed", error="the notebook did not run")
    status = "ok" if run.ok else str(run.results.get("status") or "failed")
    return StepState(
        step.id,
        step.notebook,
        status,
        str(run.run_dir),
        str(run.report),
        run.error,
        False,
        run.duration_s,
        dict(run.figures),
    )


def _reused(step: CampaignStep, done: Mapping[str, Any]) -> StepState:
    results = read_results(done["run_dir"])
    figures = results.get("figures", {}) if isinstance(results.get("figures"), dict) else {}
    return StepState(
        step.id,
        step.notebook,
        "ok",
        done["run_dir"],
        done.get("report"),
        None,
        True,
        float(results.get("duration_s") or 0.0),
        figures,
    )


def _load_state(folder: Path) -> dict[str, dict[str, Any]]:
    with contextlib.suppress(OSError, ValueError):
        data = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
        steps = data.get("steps")
        if isinstance(steps, dict):
            return {str(k): dict(v) for k, v in steps.items() if isinstance(v, dict)}
    return {}


def _save_state(folder: Path, campaign: Campaign, steps: Mapping[str, Any], shown: Sequence[str]) -> None:
    """``campaign.json``: every step's last run, which steps the latest run reached (``shown``) and the
    campaign-wide parameters it ran with — enough to write ``index.html`` again (:func:`rerender_index`)."""
    state = {
        "campaign": campaign.name,
        "title": campaign.title,
        "source": str(campaign.source) if campaign.source is not None else None,
        "parameters": dict(campaign.parameters),
        "shown": list(shown),
        "steps": steps,
    }
    write_json_atomic(folder / STATE_FILE, state)


def rerender_index(folder: str | Path) -> Path:
    """Write a campaign folder's ``index.html`` again from ``campaign.json`` and each step's run dir,
    without running anything (after freeing disk space, or to pick up a re-rendered report)."""
    folder = Path(folder).expanduser().resolve()
    try:
        data = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "FOLDER", str(folder), "a campaign folder (it holds campaign.json)", detail=str(exc)
        ) from None
    entries = {str(k): dict(v) for k, v in (data.get("steps") or {}).items() if isinstance(v, dict)}
    source = data.get("source")
    if source and source != "None" and Path(source).is_file():
        campaign = load_campaign(source)
    else:  # the campaign file moved: the steps as recorded, without the index's levers, facts and charts
        name = str(data.get("campaign") or folder.name)
        steps = tuple(
            CampaignStep(k, str(read_results(v.get("run_dir") or folder).get("notebook") or k))
            for k, v in entries.items()
        )
        campaign = Campaign(name, str(data.get("title") or name), {}, steps)
    if isinstance(data.get("parameters"), dict):
        campaign = campaign.with_parameters(data["parameters"])
    shown = data.get("shown") if isinstance(data.get("shown"), list) else list(entries)
    states: list[StepState] = []
    for step in campaign.steps:
        entry = entries.get(step.id)
        if entry is None or step.id not in shown:
            continue
        run_dir = entry.get("run_dir")
        results = read_results(run_dir) if run_dir and Path(run_dir).is_dir() else {}
        raw = results.get("figures")
        figures: dict[str, Any] = raw if isinstance(raw, dict) else {}
        states.append(
            StepState(
                step.id,
                step.notebook,
                str(entry.get("status") or "failed"),
                run_dir,
                entry.get("report"),
                results.get("error"),
                False,
                float(results.get("duration_s") or 0.0),
                figures,
            )
        )
    return write_index(campaign, folder, states)


# -- the index page ----------------------------------------------------------------------------------------


def write_index(campaign: Campaign, folder: Path, states: Sequence[StepState]) -> Path:
    """``index.html``: status per step with links, the levers with their CIs, the key facts, the key charts."""
    import jinja2

    by_id = {s.id: s for s in states}
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    page = env.get_template("campaign_index.html.j2").render(
        campaign=campaign,
        steps=[_step_view(campaign, s, folder) for s in states],
        pending=[s.id for s in campaign.steps if s.id not in by_id],
        headlines=_headline_views(states),
        levers=[_lever_view(x, by_id) for x in campaign.index.get("lever", [])],
        facts=[_fact_view(x, by_id) for x in campaign.index.get("fact", [])],
        charts=[c for c in (_chart_view(x, by_id, folder) for x in campaign.index.get("chart", [])) if c]
        + _frontier_view(states, campaign.parameters),
        provenance=_provenance(campaign),
        ok=all(s.status == "ok" for s in states) and len(states) == len(campaign.steps),
    )
    # Shared like a report: redacted, no script.
    return write_text_atomic(folder / "index.html", public_html(page, [folder]))


def _rel(path: str | None, folder: Path) -> str | None:
    if not path:
        return None
    with contextlib.suppress(ValueError):
        return str(Path(path).resolve().relative_to(folder))
    return Path(path).as_uri()


def _step_view(campaign: Campaign, s: StepState, folder: Path) -> dict[str, Any]:
    return {
        "id": s.id,
        "notebook": Path(s.notebook).stem,
        "status": s.status,
        "reused": s.reused,
        "report": _rel(s.report, folder),
        "error": s.error,
        "duration": f"{s.duration_s:.0f} s" if s.duration_s else "",
    }


def _figure(ref: str, by_id: Mapping[str, StepState]) -> Any:
    step, _, name = ref.partition(".")
    state = by_id.get(step)
    return None if state is None else state.figures.get(name)


def step_measurements(states: Sequence[StepState]) -> list[Measurement]:
    """Every throughput measurement the steps recorded (``results.json``'s ``measurements``), in step order."""
    out: list[Measurement] = []
    for s in states:
        if not s.run_dir:
            continue
        with contextlib.suppress(ConfigError):
            for item in read_results(s.run_dir).get("measurements", []):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    out.append(Measurement.from_dict(item, step=s.id))
    return out


def _headline_views(states: Sequence[StepState]) -> list[dict[str, Any]]:
    """One row per config and concurrency: its headline measurement, and every other one as such."""
    rows = []
    for lead, others in by_config(step_measurements(states)):
        rows.append(
            {
                "config": lead.config,
                "concurrency": "unlimited" if lead.concurrency is None else lead.concurrency,
                "value": lead.value_text(),
                "basis": lead.basis(),
                "others": [f"{fmt_tok_s(m.output_tok_s)}: {m.basis()}" for m in others],
            }
        )
    return rows


def _lever_view(spec: Mapping[str, Any], by_id: Mapping[str, StepState]) -> dict[str, Any]:
    value = _figure(str(spec.get("figure", "")), by_id)
    view: dict[str, Any] = {"name": str(spec.get("name", spec.get("figure"))), "measured": False}
    if isinstance(value, Mapping) and "rel" in value:
        lo, hi = value.get("ci", [None, None])
        state = {"better": "ok", "worse": "fail"}.get(str(value.get("verdict")), "info")
        view.update(
            measured=True,
            rel=f"{value['rel']:+.1%}",
            ci=f"{lo:+.1%} to {hi:+.1%}" if lo is not None and hi is not None else "",
            verdict=str(value.get("verdict")),
            state=state,
            concurrency=value.get("concurrency"),
            repeats="/".join(str(n) for n in value.get("repeats", [])),
            means=(
                f"{value.get('a')} {fmt_tok_s(value.get('mean_a'))} → {value.get('b')} {fmt_tok_s(value.get('mean_b'))}"
            ),
            workload=str(value.get("workload") or "—"),
        )
    return view


class _Missing:
    """Stands in for a figure a step did not record: formats as "(not measured)" whatever the spec."""

    def __format__(self, spec: str) -> str:
        return "(not measured)"


class _Figures:
    """One step's figures as attributes, for ``{step.figure:spec}`` in a fact's text."""

    def __init__(self, figures: Mapping[str, Any]) -> None:
        self._figures = figures

    def __getattr__(self, name: str) -> Any:
        value = self._figures.get(name)
        return _Missing() if value is None else value


class _Steps(dict[str, _Figures]):
    def __missing__(self, key: str) -> _Figures:
        return _Figures({})


def _fact_view(spec: Mapping[str, Any], by_id: Mapping[str, StepState]) -> dict[str, str]:
    steps = _Steps({k: _Figures(s.figures) for k, s in by_id.items()})
    text = str(spec.get("text", ""))
    try:
        rendered = text.format_map(steps)
    except (ValueError, TypeError, AttributeError, IndexError) as exc:
        rendered = f"(cannot fill in this fact: {exc})"
    return {"name": str(spec.get("name", "")), "text": rendered}


def _chart_view(spec: Mapping[str, Any], by_id: Mapping[str, StepState], folder: Path) -> dict[str, str] | None:
    step, _, name = str(spec.get("chart", "")).partition(".")
    state = by_id.get(step)
    if state is None or not state.run_dir:
        return None
    path = Path(state.run_dir) / "charts" / f"{name}.svg"
    if not path.is_file():
        return None
    data = base64.b64encode(path.read_bytes()).decode()
    return {
        "title": str(spec.get("title", name)),
        "src": f"data:image/svg+xml;base64,{data}",
        "report": _rel(state.report, folder) or "",
    }


def _frontier_view(states: Sequence[StepState], parameters: Mapping[str, Any]) -> list[dict[str, str]]:
    """The Pareto frontier of every config the steps measured (throughput per GPU against tok/s per user), as
    one more key chart; none when no config measured a TPOT."""
    import pandas as pd

    from dsv4lab.notebook.measurements import frontier_rows
    from dsv4lab.plots import to_svg
    from dsv4lab.plots.frontier import frontier_chart

    rows = frontier_rows(step_measurements(states))
    if not rows:
        return []
    title = "Every config measured: throughput per GPU against interactivity"
    svg = to_svg(frontier_chart(pd.DataFrame(rows), clock=params_clock(parameters), title=title))
    data = base64.b64encode(svg.encode()).decode()
    return [{"title": title, "src": f"data:image/svg+xml;base64,{data}", "report": ""}]


def _provenance(campaign: Campaign) -> list[tuple[str, str]]:
    env = environment(campaign.parameters)
    p = campaign.parameters
    rows = target_provenance(p)
    rows.append(
        (
            "versions",
            ", ".join(f"{k} {v}" for k, v in env["versions"].items() if k in ("dsv4lab", "python", "papermill")),
        )
    )
    if env.get("git"):
        rows.append(("git", str(env["git"])))
    rows.append(("written", _dt.datetime.now().astimezone().isoformat(timespec="seconds")))
    return rows
