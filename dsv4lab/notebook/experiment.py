"""What an experiment notebook needs besides the session: checked parameters, results, narrative.

Each notebook has one ``parameters`` cell of flat typed values (papermill can only inject str, int,
float, bool, list and dict), and the next cell hands them to :meth:`Experiment.from_namespace`, which checks
every value by name — a ``"1,16"`` string from ``-p concurrency 1,16`` becomes ``[1, 16]``, a wrong type is
one clear error naming the parameter and what is allowed. The experiment then builds the session
(:meth:`Experiment.lab`), the config (:meth:`Experiment.config`) and writes the step's key figures to
``results.json`` under stable names (:meth:`Experiment.record`), which the campaign passes on to the next
notebook and puts on its index page.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import shlex
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dsv4lab.atomicfile import to_jsonable, write_json_atomic
from dsv4lab.config.server_config import ConfigDiff
from dsv4lab.engines import Engine, SGLangEngine, get_engine
from dsv4lab.errors import ConfigError, DSV4LabError, UnknownNameError
from dsv4lab.notebook.lab import DEFAULT_HARDWARE, Lab
from dsv4lab.resources import CONFIGS
from dsv4lab.serving.slurm import SlurmPlacement

__all__ = [
    "RESULTS_FILE",
    "Experiment",
    "check_experiment_parameters",
    "md",
    "overrides_text",
    "parse_overrides",
    "read_results",
    "write_json_atomic",
]

#: The file a step notebook writes its figures to, in its run dir: what a campaign's next step reads.
RESULTS_FILE = "results.json"


@dataclass(frozen=True)
class Experiment:
    """The common parameters of the campaign's notebooks, checked."""

    host: str = "local"
    target: str = "twin"
    #: Empty: none named (the twin's and SGLang's preflight use the story's profile; vLLM reads the host).
    hardware: str = ""
    sglang_version: str = "0.5.23"
    #: The engine's release for any engine (vLLM's ``"0.32.0"``); empty: ``sglang_version`` for SGLang's
    #: engines, the newest dsv4lab knows for the others.
    version: str = ""
    python: str = ""
    #: The twin's pace: 0 (virtual time, the default: the same figures on any machine, as fast as it
    #: computes) or wall seconds per modelled second (see :class:`~dsv4lab.notebook.lab.Lab`).
    pace: float = 0.0
    #: SGLang's engines: a preset name or a config file; vLLM: a config file, or empty for ``model_path``.
    preset: str = "config_a"
    #: The model on the server host (vLLM's configs start from it; for SGLang it overrides the preset's).
    model_path: str = ""
    overrides: str = ""
    concurrency: tuple[int, ...] = (1, 16)
    input_len: int = 8000
    output_len: int = 256
    repeats: int = 3
    kernel_config_dir: str = ""
    run_dir: str = ""
    #: Run the servers as Slurm jobs through ``host`` (the login host): ``partition=gpu,gpus_per_node=8,
    #: time_min=30`` or the JSON a sweep passes; empty: on the host itself.
    slurm: str = ""
    #: Parameters the notebook declared beyond the common ones (run dirs of earlier steps, a chosen fix...).
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        texts = (
            "host",
            "target",
            "hardware",
            "sglang_version",
            "version",
            "python",
            "preset",
            "model_path",
            "overrides",
            "kernel_config_dir",
            "slurm",
        )
        for name in (*texts, "run_dir"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(name, getattr(self, name), "a string")
        get_engine(self.target)  # an unknown engine names the known ones
        pace_words = "0 (virtual time) or a positive number of wall seconds per modelled second"
        if isinstance(self.pace, bool) or not isinstance(self.pace, (int, float)):
            raise ConfigError("pace", self.pace, pace_words)
        if not (math.isfinite(self.pace) and self.pace >= 0):
            raise ConfigError("pace", self.pace, pace_words)
        object.__setattr__(self, "pace", float(self.pace))
        object.__setattr__(self, "concurrency", _concurrency(self.concurrency))
        for name, low in (("input_len", 1), ("output_len", 1), ("repeats", 3)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                extra = " (a trustworthy A/B needs three per arm and level)" if name == "repeats" else ""
                raise ConfigError(name, value, f"an integer >= {low}{extra}")
        parse_overrides(self.overrides)  # fail here, not at launch
        SlurmPlacement.parse(self.slurm)

    @classmethod
    def from_namespace(cls, namespace: Mapping[str, Any], *, notebook: str = "") -> Experiment:
        """The experiment from a notebook's globals (what its parameters cell defined, papermill's values
        injected). Names the experiment knows are checked; the notebook's own extra parameters are kept in
        ``extra``. Text values for list and number parameters are parsed (``"1,16"``, ``"0.05"``)."""
        known = {f.name for f in fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        for name in known:
            if name in namespace:
                values[name] = _coerce(name, namespace[name], cls.__dataclass_fields__[name].default)
        if "time_scale" in namespace and "pace" not in values:  # the old name, from an older notebook or script
            warnings.warn("the parameter time_scale is now pace (it goes next release)", FutureWarning, stacklevel=2)
            values["pace"] = _coerce("pace", namespace["time_scale"], 0.0)
        try:
            exp = cls(**values)
        except ConfigError as exc:
            where = f" in {notebook}" if notebook else ""
            raise ConfigError(f"parameter {exc.field}{where}", exc.value, exc.allowed) from None
        _notebook_display()
        return exp

    def with_extra(self, **extra: Any) -> Experiment:
        return Experiment(**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}, extra=extra)

    # -- what the notebook builds from it ----------------------------------------------------------------

    @property
    def out_dir(self) -> Path:
        """Where this run's files go: ``run_dir`` as the runner passed it, or a fresh folder for a hand run."""
        if self.run_dir:
            path = Path(self.run_dir).expanduser()
        else:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            path = Path("reports") / f"{stamp}-interactive"
            object.__setattr__(self, "run_dir", str(path.resolve()))
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        return path.resolve()

    @property
    def engine(self) -> Engine:
        return get_engine(self.target)

    @property
    def engine_version(self) -> str | None:
        """The release whose flags the session renders: ``version``, else ``sglang_version`` for SGLang's
        engines (the story's notebooks name only that one), else the newest dsv4lab knows."""
        if self.version:
            return self.version
        return (self.sglang_version or None) if isinstance(self.engine, SGLangEngine) else None

    def lab(self, *, progress: bool = True) -> Lab:
        """The session these parameters describe; servers go into ``out_dir``."""
        return Lab(
            self.host,
            target=self.target,
            hardware=self.hardware or None,
            version=self.engine_version,
            pace=self.pace or None,
            python=self.python or None,
            run_root=self.out_dir,
            kernel_config_dir=self.kernel_config_dir or None,
            progress=progress,
            slurm=SlurmPlacement.parse(self.slurm),
        )

    def config(self, preset: str | None = None, **more: Any) -> Any:
        """The session's engine's config with ``overrides`` and ``more`` applied: for SGLang's engines the
        preset (``preset`` parameter by default; a ``.toml``/``.json`` file too), ``model_path`` replacing
        its model when given; for vLLM a config file named by ``preset``, else one for ``model_path``. (Not
        mapped to the session's kernel folder: :meth:`Lab.config` does that at launch.)"""
        engine = self.engine
        name = self.preset if preset is None else preset
        changes: dict[str, Any] = {**parse_overrides(self.overrides), **more}
        if isinstance(engine, SGLangEngine):
            if self.model_path:
                changes = {"model_path": self.model_path, **changes}
            return engine.resolve_config(name or "config_a", changes, arg="preset")
        if name:
            if self.model_path:
                changes = {"model_path": self.model_path, **changes}
            elif not Path(name).expanduser().exists() and (CONFIGS / name).is_file():
                raise ConfigError(
                    "parameter model_path",
                    "",
                    f"the model on the server host (a folder or a Hugging Face id): the shipped {name} names none",
                )
            return engine.resolve_config(name, changes, arg="preset")
        if not self.model_path:
            raise ConfigError(
                "parameter model_path",
                "",
                f"the model on the server host (a folder or a Hugging Face id): a {engine.name} config starts from "
                "it (or name a config file in preset)",
            )
        return engine.resolve_config(engine.load_config({"model_path": self.model_path}), changes)

    def chart(self, chart: Any, name: str) -> None:
        """Show a chart and keep it as ``charts/<name>.svg`` in the run dir (the campaign index embeds it).

        Rendered once: the SVG written to the file is the one the notebook (and so the report) shows.
        """
        from IPython.display import display

        from dsv4lab.plots import display_metadata, mimebundle, to_spec

        spec = to_spec(chart) if not isinstance(chart, dict) else chart
        bundle = mimebundle(spec)
        folder = self.out_dir / "charts"
        folder.mkdir(exist_ok=True)
        (folder / f"{name}.svg").write_text(bundle["image/svg+xml"], encoding="utf-8")
        display(bundle, raw=True, metadata=display_metadata(spec))  # type: ignore[no-untyped-call]

    def earlier(self, name: str, value: str) -> Path:
        """An earlier step's run dir given as parameter ``name``: it must exist and hold a results.json."""
        path = Path(value).expanduser() if value else None
        if path is None or (not (path / RESULTS_FILE).is_file() and not (path / "server.log").is_file()):
            raise ConfigError(f"parameter {name}", value, "the run dir of the earlier step (with its results.json)")
        return path.resolve()

    def fix(self, diagnosis_run_dir: str = "", fix: str = "") -> dict[str, str]:
        """The fix chosen in 03 (its ``results.json``), not retyped; or ``fix`` as field=value pairs; or none
        (a sweep sets the knobs through ``overrides`` instead)."""
        if diagnosis_run_dir:
            figures = read_results(self.earlier("diagnosis_run_dir", diagnosis_run_dir)).get("figures", {})
            chosen = figures.get("chosen_fix_overrides")
            if not isinstance(chosen, str) or not chosen:
                raise ConfigError(
                    "parameter diagnosis_run_dir",
                    diagnosis_run_dir,
                    "the run dir of the step that chose the fix (03, 12: it records chosen_fix_overrides)",
                )
            return parse_overrides(chosen)
        return parse_overrides(fix)

    def record(self, **figures: Any) -> dict[str, Any]:
        """Merge figures into ``results.json`` (stable names; numbers, text, lists, dicts) and return it all."""
        path = self.out_dir / RESULTS_FILE
        current = read_results(path.parent)
        current.setdefault("figures", {}).update(to_jsonable(figures))
        write_json_atomic(path, current)
        return dict(current["figures"])

    def measured(self, source: Any, role: str = "benchmark") -> list[Any]:
        """Record the throughput measurements in ``source`` (benchmark runs, or an A/B's runs) in
        ``results.json`` under ``measurements``, with their workload and repeats, so that pages can lead
        with one headline per config (:mod:`dsv4lab.notebook.measurements`); returns them."""
        from dsv4lab.notebook.measurements import measurements

        found = measurements(source, role=role)
        path = self.out_dir / RESULTS_FILE
        current = read_results(path.parent)
        kept = [m for m in current.get("measurements", []) if isinstance(m, dict)]
        fresh = [m.to_dict() for m in found]
        keys = {(m["config"], m["concurrency"], m["workload"], m["role"]) for m in fresh}
        current["measurements"] = [
            m for m in kept if (m.get("config"), m.get("concurrency"), m.get("workload"), m.get("role")) not in keys
        ] + fresh
        write_json_atomic(path, current)
        return found

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        out["concurrency"] = list(self.concurrency)
        out.update(self.extra)
        return out


def check_experiment_parameters(params: Mapping[str, Any], *, notebook: str = "") -> None:
    """Everything about a notebook's parameters that can be known before a kernel starts, checked now.

    The runner calls this with every parameter the run will use (defaults included), before it makes a run
    dir: the values :class:`Experiment` checks, and what they name — the hardware profile, the SGLang
    release, the preset (or vLLM's ``model_path``), the overrides, a ``fix`` and a ``lever`` (with its
    ``lever_value``) applied to it in that order (an unknown field, a flag the release lacks, ``tp=3`` on a
    128-head model, a fraction of 1.5, more GPUs than the hardware has), and run dirs of earlier steps
    (``*_run_dir``) that must exist. Each failure is one :class:`ConfigError` naming the parameter.
    """
    from dsv4lab.config.hardware import hardware_profile
    from dsv4lab.config.presets import PRESETS
    from dsv4lab.config.versions import resolve_release

    where = f" of {notebook}" if notebook else ""

    def named(name: str, exc: DSV4LabError) -> ConfigError:
        """``exc`` under the parameter's name; a config field it names is kept in the message."""
        if isinstance(exc, UnknownNameError):
            return exc.within(f"parameter {name}{where}: ", field=f"parameter {name}{where}")
        if isinstance(exc, ConfigError):
            inner = exc.field.removeprefix("parameter ")
            allowed = exc.allowed if inner == name else f"{inner}={exc.value!r} is not valid: {exc.allowed}"
            return ConfigError(f"parameter {name}{where}", params.get(name), allowed, detail=exc.detail)
        return ConfigError(f"parameter {name}{where}", params.get(name), str(exc))

    values: dict[str, Any] = {}
    for name in sorted(({f.name for f in fields(Experiment)} - {"extra"}) & set(params)):
        try:
            values[name] = _coerce(name, params[name], Experiment.__dataclass_fields__[name].default)
        except ConfigError as exc:
            raise named(name, exc) from None
    try:
        exp = Experiment(**values)
        hardware_profile(exp.hardware or DEFAULT_HARDWARE)
    except ConfigError as exc:
        raise named(exc.field, exc) from None
    engine = exp.engine
    _check_tuning(params, engine, named)
    sglang = isinstance(engine, SGLangEngine)
    version_name = "version" if exp.version or not sglang else "sglang_version"
    try:
        if sglang:
            release = resolve_release(exp.engine_version, warn=False).version
        else:
            release = engine.resolve_version(exp.engine_version)
    except DSV4LabError as exc:
        raise named(version_name, exc) from None
    hardware = hardware_profile(exp.hardware or DEFAULT_HARDWARE)
    if sglang and exp.preset not in PRESETS:
        raise named("preset", UnknownNameError("preset", exp.preset, PRESETS))
    if not {"preset", "overrides", "fix", "model_path", "lever"} & set(params):
        return _check_run_dirs(exp, params, where)  # the notebook builds its own config: nothing to apply
    base_name = "preset" if sglang or exp.preset else "model_path"
    try:
        config = dataclasses.replace(exp, overrides="").config()
        if not sglang:
            engine.check_plan(config, release, hardware)
    except DSV4LabError as exc:
        own = exc.field if isinstance(exc, ConfigError) and exc.field.startswith("parameter ") else None
        raise named(own.removeprefix("parameter ") if own else base_name, exc) from None
    fix = params.get("fix")
    texts = [("overrides", exp.overrides), ("fix", fix if isinstance(fix, str) else "")]
    lever, lever_value = params.get("lever"), params.get("lever_value")
    if isinstance(lever, str) and lever:  # a notebook's one lever: a field and its value in arm B
        texts.append(("lever", f"{lever}={_override_value(lever_value)}"))
    for name, text in texts:
        try:
            changes = parse_overrides(text, name=name)
            if changes:
                config = config.with_values(changes)
                engine.check_plan(config, release, hardware)
        except DSV4LabError as exc:
            raise named(name, exc) from None
    _check_run_dirs(exp, params, where)


def _check_tuning(params: Mapping[str, Any], engine: Engine, named: Any) -> None:
    """A tuning notebook's search ``space`` (``FIELD lo:hi; FIELD v1,v2``), ``objective``, ``slo`` (``NAME MS;
    ...``) and ``floor`` (0: none), read as :meth:`Lab.tune` will read them."""
    from dsv4lab.bench.slo import parse_slo
    from dsv4lab.notebook.tune import Objective, parse_space

    if "space" not in params:
        return
    for name, check in (
        ("space", lambda: parse_space(str(params["space"]), list(engine.field_names()))),
        ("slo", lambda: parse_slo(str(params.get("slo") or ""))),
        (
            "objective",
            lambda: Objective(
                str(params.get("objective", "throughput")),
                parse_slo(str(params.get("slo") or "")),
                float(params["floor"]) if params.get("floor") else None,
            ),
        ),
    ):
        try:
            check()
        except DSV4LabError as exc:
            raise named(name, exc) from None


def _check_run_dirs(exp: Experiment, params: Mapping[str, Any], where: str) -> None:
    """Run dirs of earlier steps (``crash_run_dir``, ``diagnosis_run_dir``) must exist and hold their results."""
    for name, value in params.items():
        if name.endswith("_run_dir") and isinstance(value, str) and value:
            try:
                exp.earlier(name, value)
            except ConfigError as exc:
                raise ConfigError(f"parameter {name}{where}", value, exc.allowed) from None


def _override_value(value: Any) -> str:
    """A value as ``parse_overrides`` reads it back: ``none``, ``true``/``false``, a list as space-separated
    words (the runner reads commas as separators between pairs)."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    return str(value)


def overrides_text(changes: Mapping[str, Any] | ConfigDiff) -> str:
    """Config changes (``{"mem_fraction_static": 0.6}``, or a :class:`~dsv4lab.config.ConfigDiff`'s new values)
    as the ``overrides`` parameter's ``field=value`` words, each shell-quoted where it needs it: the inverse of
    :func:`parse_overrides`, and the one formatter every notebook, panel and campaign uses."""
    pairs = changes.items() if isinstance(changes, Mapping) else ((c.field, c.after) for c in changes)
    return " ".join(shlex.quote(f"{field}={_override_value(value)}") for field, value in pairs)


def parse_overrides(text: str, *, name: str = "overrides") -> dict[str, str]:
    """``"mem_fraction_static=0.6 cuda_graph_max_bs=16"`` (spaces or commas) as field -> text value;
    ``name`` is the parameter an error names."""
    out: dict[str, str] = {}
    if not text or not text.strip():
        return out
    try:
        words = shlex.split(text.replace(",", " "))
    except ValueError as exc:
        raise ConfigError(name, text, "field=value pairs separated by spaces", detail=str(exc)) from None
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise ConfigError(name, word, "field=value, e.g. mem_fraction_static=0.6 or speculative.num_steps=2")
        out[key.strip()] = value
    return out


def read_results(run_dir: str | Path) -> dict[str, Any]:
    """A run dir's ``results.json`` ({} when there is none yet)."""
    path = Path(run_dir) / RESULTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError("results", str(path), "a readable results.json", detail=str(exc)) from None
    return data if isinstance(data, dict) else {}


def _notebook_display() -> None:
    """In a kernel, charts render offline (Vega-Lite in JupyterLab, SVG in reports) with dsv4lab's theme."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover
        return
    if get_ipython() is not None:
        from dsv4lab.plots import enable_offline_renderer

        enable_offline_renderer()


def md(text: str) -> None:
    """Show narrative built from measured numbers as Markdown (in reports the cell's code is hidden)."""
    from IPython.display import Markdown, display

    display(Markdown(text))  # type: ignore[no-untyped-call]


# -- helpers -----------------------------------------------------------------------------------------------


def _concurrency(value: Any) -> tuple[int, ...]:
    """The ``concurrency`` parameter as levels, refused as a parameter (ConfigError) when it is not one."""
    from dsv4lab.bench.workload import parse_levels as parse
    from dsv4lab.errors import BenchError

    try:
        return tuple(parse(value if not isinstance(value, tuple) else list(value)))
    except BenchError:
        raise ConfigError("concurrency", value, "one or more integers >= 1, e.g. [1, 16] or 1,16") from None


def _coerce(name: str, value: Any, default: Any) -> Any:
    """Text for a number or list parameter (``-p pace 0.05`` from a shell) is parsed, not rejected."""
    if not isinstance(value, str) or isinstance(default, str):
        return list(value) if isinstance(value, tuple) else value
    text = value.strip()
    if isinstance(default, bool):
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise ConfigError(name, value, "true or false")
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise ConfigError(name, value, "an integer") from None
    if isinstance(default, float):
        try:
            return float(text)
        except ValueError:
            raise ConfigError(name, value, "a number") from None
    return value  # concurrency: parsed by _concurrency
