"""Run one experiment notebook headlessly: checked parameters in, a run dir with a report out.

``run_notebook("03_mtp_oom_diagnosis", {"crash_run_dir": ...})`` checks every parameter against the
notebook's ``parameters`` cell *before* a kernel starts (an unknown name or a wrong type is one clear
error), makes a new ``reports/<timestamp>-<name>/`` (nothing is ever overwritten), writes
``params.json`` and ``env.json``, executes the notebook with papermill in that directory (the run dir is
also passed to the notebook as an absolute path), and — whatever happened — renders ``report.html`` from
what was executed and records the status in ``results.json``. A failed notebook still leaves its report,
with a banner linking to the failing cell, and raises :class:`~dsv4lab.errors.NotebookError` naming it.
Servers the notebook started and did not stop (a kernel that died) are stopped afterwards.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as _dt
import importlib.metadata
import json
import platform
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4lab.atomicfile import write_json_atomic, write_text_atomic
from dsv4lab.engines import ENGINES
from dsv4lab.errors import ConfigError, DSV4LabError, Interrupted, NotebookError, UnknownNameError
from dsv4lab.notebook.experiment import RESULTS_FILE, check_experiment_parameters, read_results
from dsv4lab.notebook.report import redact_notebook_file
from dsv4lab.resources import NOTEBOOKS, PACKAGE_DIR
from dsv4lab.secrets import collect_secrets
from dsv4lab.units import REAL, Clock

__all__ = [
    "NOTEBOOK_DIR",
    "NotebookRun",
    "Parameter",
    "check_hosts",
    "check_parameters",
    "find_notebook",
    "list_notebooks",
    "new_run_dir",
    "notebook_parameters",
    "parse_cli_value",
    "render_run",
    "run_host",
    "run_notebook",
    "stop_orphans",
]

#: The campaign's notebooks, shipped with the package (``notebooks/`` in the repository is the same files).
NOTEBOOK_DIR = NOTEBOOKS

#: Packages whose versions a report records.
_VERSIONS = (
    "dsv4lab",
    "papermill",
    "nbclient",
    "nbconvert",
    "ipykernel",
    "pandas",
    "altair",
    "vl-convert-python",
    "paramiko",
    "aiohttp",
)


@dataclass(frozen=True)
class Parameter:
    """One line of a notebook's ``parameters`` cell: ``name: type = default  # help``."""

    name: str
    type_name: str
    default: str
    help: str


@dataclass(frozen=True)
class NotebookRun:
    """What one headless run left behind."""

    name: str
    notebook: Path
    run_dir: Path
    report: Path
    executed: Path
    parameters: Mapping[str, Any]
    ok: bool
    error: str | None = None
    duration_s: float = 0.0
    results: Mapping[str, Any] = field(default_factory=dict)
    #: Files of the record that could not be written (a full disk): each with why.
    unsaved: tuple[str, ...] = ()

    @property
    def figures(self) -> Mapping[str, Any]:
        """The key figures the notebook recorded (``results.json``'s ``figures``)."""
        figures = self.results.get("figures")
        return figures if isinstance(figures, Mapping) else {}

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        facts: list[tuple[str, object]] = [("report", str(self.report)), ("run dir", str(self.run_dir))]
        if self.error:
            facts.append(("error", self.error))
        facts += [(k, v) for k, v in list(self.figures.items())[:12] if not isinstance(v, (dict, list))]
        status = "completed" if self.ok else "failed"
        return hv.card(f"notebook {self.name}", hv.kv_table(facts), state="ok" if self.ok else "fail", status=status)


# -- notebooks and their parameters ---------------------------------------------------------------------------


def list_notebooks() -> list[str]:
    """The shipped experiment notebooks, by name (without ``.ipynb``)."""
    return sorted(p.stem for p in NOTEBOOK_DIR.glob("*.ipynb"))


def find_notebook(name: str | Path) -> Path:
    """A notebook by path, or by the name of a shipped one (``03_mtp_oom_diagnosis``, with or without
    ``.ipynb``, or just its number ``03``)."""
    path = Path(name).expanduser()
    if path.suffix == ".ipynb" and path.is_file():
        return path.resolve()
    stem = path.name.removesuffix(".ipynb")
    shipped = {p.stem: p for p in NOTEBOOK_DIR.glob("*.ipynb")}
    if stem in shipped:
        return shipped[stem]
    numbered = [p for s, p in shipped.items() if s.split("_", 1)[0] == stem]
    if len(numbered) == 1:
        return numbered[0]
    raise UnknownNameError("notebook", str(name), sorted(shipped), also="a .ipynb file")


def notebook_parameters(path: str | Path) -> dict[str, Parameter]:
    """The parameters cell as papermill reads it: name, type, default and help per parameter."""
    import papermill

    nb_path = find_notebook(path)
    try:
        raw = papermill.inspect_notebook(str(nb_path))
    except Exception as exc:  # papermill raises plain exceptions for unreadable notebooks
        raise ConfigError(
            "notebook", str(nb_path), "a readable notebook with a parameters cell", detail=str(exc)
        ) from exc
    return {
        name: Parameter(
            name, str(p.get("inferred_type_name") or "None"), str(p.get("default")), str(p.get("help") or "")
        )
        for name, p in raw.items()
    }


def parse_cli_value(text: str) -> Any:
    """A ``-p name value`` value: JSON when it parses (``16``, ``0.6``, ``true``, ``[1, 16]``), a list for
    ``1,16``, else the text."""
    with contextlib.suppress(ValueError):
        return json.loads(text)
    if "," in text:
        return [parse_cli_value(part.strip()) for part in text.split(",") if part.strip()]
    return text


def check_parameters(path: str | Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """``given`` checked against the notebook's parameters cell: unknown names and wrong types are a
    :class:`ConfigError` naming the notebook, the parameter and what it takes; text is converted where the
    declared type says how (``"0.6"`` for a float, ``"1,16"`` for a list)."""
    nb_path = find_notebook(path)
    declared = notebook_parameters(nb_path)
    out: dict[str, Any] = {}
    for name, value in given.items():
        p = declared.get(name)
        if p is None:
            where = f" of {nb_path.stem}"
            raise UnknownNameError("parameter", name, declared, field=f"parameter {name}{where}", where=where)
        out[name] = _convert(nb_path.stem, p, value)
    defaults = {n: _literal(p.default) if _literal(p.default) is not None else p.default for n, p in declared.items()}
    check_experiment_parameters({**defaults, **out}, notebook=nb_path.stem)  # what they name, before a run dir
    return out


def run_host(path: str | Path, params: Mapping[str, Any]) -> str | None:
    """The host a run of the notebook with ``params`` opens (its ``host`` parameter as given, else the
    notebook's default), or None when the notebook declares no host."""
    nb_path = find_notebook(path)
    if "host" not in notebook_parameters(nb_path):
        return None
    host = effective_parameters(nb_path, params).get("host")
    return str(host) if host not in (None, "") else None


def check_hosts(hosts: Mapping[str, str], *, trust_host_key: bool = False) -> None:
    """Each host (spec -> where it was given, for the error) connected to once, before a run dir or a kernel:
    a mistyped alias, an unreachable host or an unknown host key is one error now (exit 3, or 4 for the
    key), not a kernel that fails its first cell. See :func:`dsv4lab.hosts.check_host`."""
    from dsv4lab.hosts import check_host

    for spec, where in hosts.items():
        check_host(spec, where=where, trust_unknown_host=trust_host_key)


def _convert(notebook: str, p: Parameter, value: Any) -> Any:
    where = f"parameter {p.name} of {notebook}"
    kind = p.type_name
    if kind == "str":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        if not isinstance(value, str):
            raise ConfigError(where, value, f"text ({p.help or 'a string'})")
        return value
    if kind == "bool":
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        if not isinstance(value, bool):
            raise ConfigError(where, value, "true or false")
        return value
    if kind == "int":
        if isinstance(value, str):
            value = parse_cli_value(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(where, value, f"an integer ({p.help})" if p.help else "an integer")
        return value
    if kind == "float":
        if isinstance(value, str):
            value = parse_cli_value(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(where, value, f"a number ({p.help})" if p.help else "a number")
        return float(value)
    if kind == "list":
        if isinstance(value, str):
            value = parse_cli_value(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(where, value, f"a list ({p.help})" if p.help else "a list")
        items = list(value)
        kinds = {type(x) for x in _literal(p.default) or []}
        if kinds == {int} and any(isinstance(x, bool) or not isinstance(x, int) for x in items):
            raise ConfigError(where, value, f"a list of integers ({p.help})" if p.help else "a list of integers")
        return items
    if kind == "dict" and not isinstance(value, dict):
        raise ConfigError(where, value, "a mapping")
    return value


# -- running ----------------------------------------------------------------------------------------------

#: How long (s) to wait after a cell's reply for its last outputs. With nbclient's default (4 s) a loaded
#: machine that delays the kernel's output channel loses what the cell printed (nbclient's own help names
#: CI machines); a report must keep everything the cell said.
IOPUB_TIMEOUT_S = 30


def _ipc_kernel_manager() -> type:
    """The kernel manager papermill starts: Unix sockets, and no stray interrupt at shutdown (see
    :mod:`dsv4lab.notebook.nbkernel`)."""
    from dsv4lab.notebook.nbkernel import HeadlessKernelManager

    return HeadlessKernelManager


def _literal(text: str) -> Any:
    """A default as written in the parameters cell, as a value (None when it is not a literal)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None


def new_run_dir(root: Path, name: str, *, now: _dt.datetime | None = None) -> Path:
    """``root/<YYYYmmdd-HHMMSS>-<name>``, created; a suffix keeps it unique: nothing is overwritten."""
    stamp = (now or _dt.datetime.now()).strftime("%Y%m%d-%H%M%S")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for i in range(1, 1000):
        path = root / (f"{stamp}-{name}" if i == 1 else f"{stamp}-{name}-{i}")
        try:
            path.mkdir(mode=0o700)  # private: a run's record is the user's to share, redacted
        except FileExistsError:
            continue
        return path.resolve()
    raise DSV4LabError(f"cannot make a new run dir for {name} under {root}")


def run_notebook(
    notebook: str | Path,
    parameters: Mapping[str, Any] | None = None,
    *,
    reports_root: str | Path = "reports",
    run_dir: str | Path | None = None,
    kernel_name: str = "python3",
    execution_timeout_s: float = 3600.0,
    start_timeout_s: float = 120.0,
    log_output: bool = False,
    raise_on_error: bool = True,
    trust_host_key: bool = False,
) -> NotebookRun:
    """Execute ``notebook`` with ``parameters`` into a new run dir and render its report (see module doc).

    ``run_dir`` uses that (new, empty) folder instead of making one under ``reports_root``. With
    ``raise_on_error`` a failed notebook raises :class:`NotebookError` (``.run`` holds this result);
    otherwise the result comes back with ``ok=False``. The ``host`` parameter is connected to first (a
    :class:`~dsv4lab.errors.HostError` before anything is made); ``trust_host_key`` records an unknown
    host key in ``~/.ssh/known_hosts`` then, where the notebook's session finds it.
    """
    timeout_ok = isinstance(execution_timeout_s, (int, float)) and not isinstance(execution_timeout_s, bool)
    if not (timeout_ok and 0 < execution_timeout_s < float("inf")):
        raise ConfigError("execution_timeout_s", execution_timeout_s, "a positive number of seconds per cell")
    nb_path = find_notebook(notebook)
    params = check_parameters(nb_path, parameters or {})
    host = run_host(nb_path, params)
    if host is not None:
        check_hosts({host: f"parameter host of {nb_path.stem}"}, trust_host_key=trust_host_key)
    out_dir = _prepare_run_dir(nb_path, params, run_dir, reports_root)
    executed = out_dir / "notebook.ipynb"
    started = time.monotonic()
    # Whatever happens in the notebook, the servers it left are stopped and the report is written.
    status, error = _execute(
        nb_path,
        executed,
        params,
        out_dir,
        kernel_name=kernel_name,
        log_output=log_output,
        execution_timeout_s=execution_timeout_s,
        start_timeout_s=start_timeout_s,
    )
    duration = time.monotonic() - started
    stopped = stop_orphans(out_dir)
    run = _record_run(nb_path, out_dir, executed, params, status, error, duration, stopped)
    _raise_for(run, nb_path.stem, status, error, duration, raise_on_error)
    return run


def _prepare_run_dir(
    nb_path: Path, params: dict[str, Any], run_dir: str | Path | None, reports_root: str | Path
) -> Path:
    """The run dir (given, or new under ``reports_root``) with the parameters and environment it ran with;
    a notebook that declares ``run_dir`` is told where it is."""
    out_dir = Path(run_dir).resolve() if run_dir is not None else new_run_dir(Path(reports_root), nb_path.stem)
    out_dir.mkdir(parents=True, exist_ok=True)
    declared = notebook_parameters(nb_path)
    if "run_dir" in declared:
        params["run_dir"] = str(out_dir)
    write_json_atomic(out_dir / "params.json", params)
    write_json_atomic(out_dir / "env.json", environment(params))
    return out_dir


def _execute(
    nb_path: Path,
    executed: Path,
    params: Mapping[str, Any],
    out_dir: Path,
    *,
    kernel_name: str,
    log_output: bool,
    execution_timeout_s: float,
    start_timeout_s: float,
) -> tuple[str, str | None]:
    """papermill's run of the notebook: ("ok", None), ("failed", the cell's error) or ("interrupted", ...)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    try:
        papermill.execute_notebook(
            str(nb_path),
            _atomic_output(executed),
            parameters=params,
            cwd=str(out_dir),
            kernel_name=kernel_name,
            log_output=log_output,
            progress_bar=False,
            execution_timeout=execution_timeout_s,
            start_timeout=start_timeout_s,
            kernel_manager_class=_ipc_kernel_manager(),
            iopub_timeout=IOPUB_TIMEOUT_S,
        )
    except PapermillExecutionError as exc:
        return "failed", f"In [{exc.exec_count}]: {exc.ename}: {exc.evalue}"
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM through the CLI
        return "interrupted", "stopped by the user"
    except Exception as exc:  # a kernel that died, a timeout: the report still gets written
        return "failed", f"{type(exc).__name__}: {exc}"
    return "ok", None


def _record_run(
    nb_path: Path,
    out_dir: Path,
    executed: Path,
    params: dict[str, Any],
    status: str,
    error: str | None,
    duration: float,
    stopped: list[str],
) -> NotebookRun:
    """results.json and the report; a full disk before they could be written is said in ``unsaved``."""
    try:
        return _finish(nb_path, out_dir, executed, params, status, error, duration, stopped)
    except OSError as exc:
        unsaved = (f"results.json and report.html ({exc.strerror or exc})",)
        return NotebookRun(
            nb_path.stem,
            nb_path,
            out_dir,
            out_dir / "report.html",
            executed,
            dict(params),
            False,
            error,
            duration,
            {},
            unsaved,
        )


def _raise_for(
    run: NotebookRun, nb: str, status: str, error: str | None, duration: float, raise_on_error: bool
) -> None:
    """A Stop raises Interrupted, an incomplete record NotebookError always, a failed notebook when asked."""
    out_dir = run.run_dir
    if status == "interrupted":
        raise Interrupted(f"notebook {nb}", run, elapsed_s=duration, note=f"what ran is in its report: {run.report}")
    if run.unsaved:
        what = f"failed: {error}" if error else "ran"
        raise NotebookError(
            f"notebook {nb} {what}, but its record in {out_dir} is incomplete: could not write "
            f"{'; '.join(run.unsaved)}. Free space there, then `dsv4lab report {out_dir}` renders the report "
            "from what was kept",
            run,
        )
    if not run.ok and raise_on_error:
        raise NotebookError(f"notebook {nb} failed: {error}; report: {run.report}#papermill-error-cell", run)


#: papermill saves the executed notebook after every cell; through this scheme each save replaces the file
#: whole (a temp file renamed into place), so a full disk or a killed runner leaves the last whole version.
_ATOMIC = "dsv4lab-atomic://"


class _AtomicWriter:
    """A papermill I/O handler for ``dsv4lab-atomic://<path>``: local files, replaced whole on write."""

    def read(self, path: str) -> str:
        return Path(path.removeprefix(_ATOMIC)).read_text(encoding="utf-8")

    def listdir(self, path: str) -> list[str]:
        folder = Path(path.removeprefix(_ATOMIC))
        return [str(p) for p in folder.iterdir()]

    def write(self, buf: str, path: str) -> None:
        write_text_atomic(path.removeprefix(_ATOMIC), buf)

    def pretty_path(self, path: str) -> str:
        return path.removeprefix(_ATOMIC)


_registered: list[bool] = []


def _atomic_output(path: Path) -> str:
    if not _registered:
        from papermill.iorw import papermill_io

        papermill_io.register(_ATOMIC, _AtomicWriter())
        _registered.append(True)
    return _ATOMIC + str(path)


def _finish(
    nb_path: Path,
    out_dir: Path,
    executed: Path,
    params: Mapping[str, Any],
    status: str,
    error: str | None,
    duration: float,
    stopped: list[str],
) -> NotebookRun:
    results = read_results(out_dir)
    results.update(
        notebook=nb_path.stem,
        status=status,
        error=error,
        duration_s=round(duration, 2),
        parameters=dict(params),
        finished_at=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),
    )
    if stopped:
        results["stopped_servers"] = stopped
    redact_notebook_file(executed, collect_secrets(params))  # before anything reads it for people
    unsaved: list[str] = []
    try:
        write_json_atomic(out_dir / RESULTS_FILE, results)
    except OSError as exc:  # whole or not at all: the previous results.json (if any) stays as it was
        unsaved.append(f"{RESULTS_FILE} ({exc.strerror or exc})")
    report = out_dir / "report.html"
    try:
        _render(nb_path, executed if executed.exists() else nb_path, out_dir, report, params, status, error)
    except OSError as exc:
        unsaved.append(f"report.html ({exc.strerror or exc})")
    except Exception:  # noqa: S110 - a report that cannot render must not hide the notebook's own error
        pass
    return NotebookRun(
        nb_path.stem,
        nb_path,
        out_dir,
        report,
        executed,
        dict(params),
        status == "ok",
        error,
        duration,
        results,
        tuple(unsaved),
    )


def read_run(nb_path: Path, out_dir: Path, parameters: Mapping[str, Any]) -> NotebookRun:
    """The record a finished run left in ``out_dir`` (its ``results.json``), as :func:`run_notebook` returns it:
    what a sweep reads from a point run in another process."""
    results = read_results(out_dir)
    status = str(results.get("status") or "failed")
    error = results.get("error")
    if not results:
        error = f"the point's run left no {RESULTS_FILE} in {out_dir}"
    return NotebookRun(
        nb_path.stem,
        nb_path,
        out_dir,
        out_dir / "report.html",
        out_dir / "notebook.ipynb",
        dict(parameters),
        status == "ok",
        None if error is None else str(error),
        float(results.get("duration_s") or 0.0),
        results,
    )


def _render(
    nb_path: Path,
    source: Path,
    out_dir: Path,
    report: Path,
    params: Mapping[str, Any],
    status: str,
    error: str | None,
) -> Path:
    """``report.html`` from the executed notebook, with the provenance header and the run's status."""
    from dsv4lab.notebook.report import render_report

    provenance = _provenance(effective_parameters(nb_path, params), out_dir)
    if status != "ok":  # the banner says "failed"; this row says how (interrupted, the kernel died, ...)
        provenance.insert(0, ("status", f"{status}: {error}" if error else status))
    try:
        return render_report(source, report, title=_title(nb_path), provenance=provenance, ok=status == "ok")
    except BaseException:
        with contextlib.suppress(OSError):  # a half-written temp file is not a report
            report.with_name(report.name + ".tmp").unlink()
        raise


def render_run(run_dir: str | Path) -> Path:
    """Render ``report.html`` of a finished (or failed, or interrupted) run again from its executed notebook,
    with the same provenance header and status — after freeing disk space, or after a template change."""
    out_dir = Path(run_dir).expanduser().resolve()
    executed = out_dir / "notebook.ipynb"
    if not executed.is_file():
        raise ConfigError("RUN_DIR", str(run_dir), "a run dir made by dsv4lab run (it holds notebook.ipynb)")
    results = read_results(out_dir)
    try:
        params = json.loads((out_dir / "params.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        params = results.get("parameters") if isinstance(results.get("parameters"), dict) else {}
    status = str(results.get("status") or "unknown")
    error = results.get("error")
    if status == "unknown":
        error = "results.json records no status: the run did not finish writing its record"
    return _render(executed, executed, out_dir, out_dir / "report.html", params, status, error)


def _title(nb_path: Path) -> str:
    """The notebook's first Markdown heading, else its file name."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        for cell in json.loads(nb_path.read_text(encoding="utf-8"))["cells"]:
            if cell.get("cell_type") == "markdown":
                text = "".join(cell.get("source", ""))
                for line in text.splitlines():
                    if line.startswith("# "):
                        return line[2:].strip()
    return nb_path.stem.replace("_", " ")


def effective_parameters(nb_path: Path, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter the run used: the notebook's defaults, overridden by what was given."""
    out: dict[str, Any] = {}
    for name, p in notebook_parameters(nb_path).items():
        try:
            out[name] = ast.literal_eval(p.default)
        except (ValueError, SyntaxError):
            out[name] = p.default
    out.update(given)
    return out


def _provenance(params: Mapping[str, Any], out_dir: Path) -> list[tuple[str, str]]:
    env = {}
    with contextlib.suppress(OSError, ValueError):
        env = json.loads((out_dir / "env.json").read_text(encoding="utf-8"))
    rows = target_provenance(params)
    shown = {"target", "host", "hardware", "pace", "time_scale", "run_dir"}
    rest = ", ".join(f"{k}={v!r}" for k, v in params.items() if k not in shown and v not in (None, "", []))
    if rest:
        rows.append(("parameters", rest))
    versions = env.get("versions", {})
    rows.append(
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("dsv4lab", "papermill", "altair")))
    )
    if env.get("git"):
        rows.append(("git", str(env["git"])))
    rows.append(("run", f"{out_dir.name} ({env.get('started_at', '')})"))
    return rows


def params_clock(params: Mapping[str, Any]) -> Clock:
    """The clock a run with these notebook parameters reads its figures on (its engine's; as measured when
    the parameters name no engine dsv4lab knows)."""
    engine = ENGINES.get(str(params.get("target", "twin")))
    if engine is None:
        return REAL
    try:
        pace = float(params.get("pace") or params.get("time_scale") or 0.0)
        return engine.session_clock(pace if pace > 0 else None, str(params.get("hardware", "")) or None)
    except (TypeError, ValueError):
        return REAL


def target_provenance(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A report's first provenance rows: what the server was, where, on which hardware and clock."""
    engine = ENGINES.get(str(params.get("target", "twin")))
    rows: list[tuple[str, str]] = [
        ("target", engine.description if engine else str(params.get("target"))),
        ("host", str(params.get("host", "local"))),
    ]
    if params.get("hardware"):  # a run that names no profile (vLLM on its host) claims none
        rows.append(("hardware", str(params["hardware"])))
    clock = params_clock(params)
    if clock.is_twin:
        rows.append(("clock", clock.note()))
    return rows


def environment(params: Mapping[str, Any]) -> dict[str, Any]:
    """``env.json``: package versions, the machine, the git commit, and what was run against."""
    versions: dict[str, str] = {"python": platform.python_version()}
    for name in _VERSIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions[name] = importlib.metadata.version(name)
    target = str(params.get("target", "twin"))
    twin = params_clock(params).is_twin
    return {
        "started_at": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "versions": versions,
        "machine": {"system": platform.system(), "release": platform.release(), "arch": platform.machine()},
        "git": _git_commit(),
        "host": params.get("host", "local"),
        "target": target,
        "twin": twin,
        "hardware": params.get("hardware"),
        "clock": params_clock(params).kind,
    }


def _git_commit() -> str | None:
    """The checkout dsv4lab runs from (with ``+dirty`` for uncommitted changes), or None when installed."""
    root = PACKAGE_DIR.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def stop_orphans(run_dir: Path) -> list[str]:
    """Stop servers launched under ``run_dir`` that still run and were not launched to be kept.

    The session stops its servers when the kernel exits; a kernel that died (out of memory, killed) cannot,
    and a GPU held by an orphan blocks the next launch. Each launch leaves ``server.json`` in its local dir.
    A server whose launcher is gone but whose processes are not (a crashed vLLM's API server or EngineCore)
    has its process group ended.
    """
    from dsv4lab.hosts import open_host
    from dsv4lab.serving.launch import attach

    stopped: list[str] = []
    for record in sorted(run_dir.glob("**/server.json")):
        try:
            data = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if data.get("keep"):
            continue
        with contextlib.suppress(DSV4LabError):
            host = open_host(str(data.get("host_spec") or "local"))
            try:
                handle = attach(host, str(data["run_dir"]))
                if handle.is_alive():
                    handle.stop(grace_s=5.0)
                    stopped.append(str(data["run_dir"]))
                elif handle.reap() is not None:  # the launcher is gone, processes of its group are not
                    stopped.append(str(data["run_dir"]))
            finally:
                host.close()
    return stopped


_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
