"""The panel's buttons: Launch, Stop, Bench, Diagnose, Save TOML, launch script, Open as experiment.

Each long one runs in :class:`~dsv4lab.notebook.widgets.actions.Jobs`' worker thread and calls exactly what a cell
would (``lab.launch``, ``server.wait``, ``server.bench``, ``server.diagnose``), so the panel shows nothing
a notebook could not reproduce. Stop is not a job: it must work while a launch or a benchmark is running,
so it stops the server from its own thread, and the running action ends on what the watcher or the
benchmark then sees (STOPPED, a partial run).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import ipywidgets as widgets

from dsv4lab import htmlview as hv
from dsv4lab.config.server_config import ConfigDiff, ServerConfig
from dsv4lab.model.memory import Preflight
from dsv4lab.notebook.widgets import reproduce as ex
from dsv4lab.notebook.widgets.actions import Jobs, ResultsPane, ServerMonitor, StateBadge
from dsv4lab.notebook.widgets.chartslot import ChartSlot
from dsv4lab.notebook.widgets.logpane import LogPane
from dsv4lab.resources import NOTEBOOKS
from dsv4lab.units import fmt_tok_s

if TYPE_CHECKING:
    from dsv4lab.notebook.lab import Lab
    from dsv4lab.notebook.server import Server

__all__ = ["PanelState", "ServerActions"]


class PanelState(Protocol):
    """What the action bar reads of its panel (a :class:`~dsv4lab.notebook.widgets.panel.ConfigPanel`):
    the session settings, the config as edited, and the panes it writes its results into."""

    host: str
    target: str
    pace: float | None
    run_root: str | Path
    given_lab: Lab | None
    preset_name: str
    results: ResultsPane
    jobs: Jobs
    badge: StateBadge
    log: LogPane
    gpu_chart: ChartSlot

    @property
    def config(self) -> ServerConfig | None: ...

    @property
    def preflight(self) -> Preflight | None: ...

    @property
    def changes(self) -> ConfigDiff: ...

    @property
    def hardware(self) -> str: ...

    @property
    def sglang_version(self) -> str: ...

    @property
    def concurrency(self) -> list[int] | None: ...


#: How long Stop gives the server to end on SIGTERM before SIGKILL.
STOP_GRACE_S = 10.0

#: How often the badge of a server whose Slurm job waits asks Slurm again (its reason can change).
QUEUE_POLL_S = 1.0


def _default_notebooks_dir() -> Path:
    here = Path.cwd()
    if ex.experiment_notebooks(here):
        return here
    shipped = NOTEBOOKS  # dsv4lab/notebooks: the repository's notebooks/
    return shipped if shipped.is_dir() else here


class ServerActions:
    """The action bar of a panel (:class:`PanelState`: a ConfigPanel) and the server it launched."""

    def __init__(
        self,
        panel: PanelState,
        *,
        notebooks_dir: str | Path | None,
        reports_root: str | Path,
        ready_timeout_s: float,
        stall_after_s: float,
    ) -> None:
        self.panel = panel
        self.ready_timeout_s = ready_timeout_s
        self.stall_after_s = stall_after_s
        self.reports_root = Path(reports_root)
        self.notebooks_dir = Path(notebooks_dir) if notebooks_dir is not None else _default_notebooks_dir()
        self.server: Server | None = None
        self.monitor: ServerMonitor | None = None
        self.labs: dict[tuple[str, str], Lab] = {}
        self._stopping: threading.Thread | None = None

        def button(key: str, text: str, tip: str, style: str = "", icon: str = "") -> Any:
            b = widgets.Button(description=text, tooltip=tip, button_style=style, icon=icon)
            b.layout = widgets.Layout(width="auto")
            b.add_class(f"dsv4lab-{key}")
            return b

        self.buttons: dict[str, Any] = {
            "launch": button("launch", "Launch", "start this config and watch it to a verdict", "primary", "play"),
            "stop": button("stop", "Stop", "stop the server (and whatever runs on it)", "danger", "stop"),
            "bench": button("bench", "Bench", "benchmark at the 'bench at' concurrency levels", "info", "tachometer"),
            "diagnose": button(
                "diagnose", "Diagnose", "read the server's whole log: cause, evidence, fixes", "warning"
            ),
            "save": button("save", "Save TOML", "write the config (as for the real host) to the file named here"),
            "script": button("script", "Launch script", "the bash script that starts this config on a real host"),
            "experiment": button(
                "experiment", "Open as experiment", "run the chosen notebook headless with these values"
            ),
        }
        self.save_path = widgets.Text(value="panel-config.toml", layout=widgets.Layout(width="14em"))
        notebooks = ex.experiment_notebooks(self.notebooks_dir)
        default_nb = ex.matching_notebook(panel.preset_name, notebooks)
        self.notebook_picker = widgets.Dropdown(
            options=[(nb.stem, str(nb)) for nb in notebooks] or [("(no experiment notebooks found)", "")],
            value=str(default_nb) if default_nb is not None else "",
            layout=widgets.Layout(width="17em"),
        )
        handlers = {
            "launch": self.launch,
            "stop": self.stop,
            "bench": self.bench,
            "diagnose": self.diagnose,
            "save": self.save,
            "script": self.script,
            "experiment": self.experiment,
        }
        for key, handler in handlers.items():
            self.buttons[key].on_click(lambda _b, h=handler: self._guard(h))
        b = self.buttons
        self.widget = widgets.VBox(
            [
                widgets.HBox(
                    [
                        b["launch"],
                        b["stop"],
                        b["bench"],
                        b["diagnose"],
                        widgets.HTML("&nbsp;server:"),
                        panel.badge.widget,
                    ],
                    layout=widgets.Layout(align_items="center"),
                ),
                widgets.HBox(
                    [self.save_path, b["save"], b["script"], self.notebook_picker, b["experiment"]],
                    layout=widgets.Layout(align_items="center", flex_flow="row wrap"),
                ),
            ],
            layout=widgets.Layout(border_top="1px solid #d0d7de", padding="0.4em 0 0 0", margin="0.3em 0 0 0"),
        )

    # -- plumbing ----------------------------------------------------------------------------------------

    def select_notebook(self, preset: str) -> None:
        """Point "Open as experiment" at the step notebook named after ``preset`` (when there is one)."""
        notebooks = [Path(str(v)) for _, v in self.notebook_picker.options if v]
        match = ex.matching_notebook(preset, notebooks)
        if match is not None:
            self.notebook_picker.value = str(match)

    def _guard(self, handler: Any) -> None:
        """A click handler's exception goes to the results pane: in JupyterLab it would vanish."""
        try:
            handler()
        except Exception as exc:
            self.panel.results.error("action", exc)

    def update_buttons(self) -> None:
        p, s = self.panel, self.server
        busy = p.jobs.busy
        b = self.buttons
        b["launch"].disabled = busy or p.config is None
        b["stop"].disabled = s is None or s.stopped is not None
        b["bench"].disabled = busy or s is None or not s.ready or p.concurrency is None
        b["diagnose"].disabled = busy or s is None
        b["save"].disabled = p.config is None
        b["script"].disabled = p.config is None
        b["experiment"].disabled = busy or p.config is None or not self.notebook_picker.value
        p.badge.set(activity=f"{p.jobs.current}…" if busy else "")

    def lab(self) -> Lab:
        """The session for the chosen hardware and release (the given one when it matches)."""
        from dsv4lab.notebook.lab import Lab

        p = self.panel
        key = (p.hardware, p.sglang_version)
        given = p.given_lab
        if given is not None and (given.hardware.name, given.sglang_version) == key:
            return given
        if key not in self.labs:
            host = given.host if given is not None else p.host
            target: Any = self.lab_target()
            self.labs[key] = Lab(
                host,
                target=target,
                hardware=p.hardware,
                sglang_version=p.sglang_version,
                pace=given.pace if given is not None else p.pace,
                run_root=given.run_root if given is not None else p.run_root,
                progress=False,
            )
        return self.labs[key]

    def host_name(self) -> str:
        from dsv4lab.hosts import LocalHost

        given = self.panel.given_lab
        if given is None:
            return self.panel.host
        return "local" if isinstance(given.host, LocalHost) else str(given.host.name)

    # -- Launch / Stop / Bench / Diagnose -------------------------------------------------------------------

    def launch(self) -> None:
        p = self.panel
        config, predicted = p.config, p.preflight
        if config is None:
            p.results.add(hv.card("launch", hv.p("Fix the highlighted setting first."), state="warn"), "")
            return
        name = p.preset_name + ("-tweaked" if p.changes else "")
        label = f"{name} ({p.hardware})"

        def run() -> None:
            old = self.server
            if old is not None and old.stopped is None and old.state in ("starting", "READY"):
                old.stop(grace_s=STOP_GRACE_S)
                p.results.add(hv.card(f"server {old.name}", hv.p("stopped before the new launch")), "")
            if self.monitor is not None:
                self.monitor.stop()
            lab = self.lab()
            server = lab.launch(config, name=name)
            self.server = server
            p.badge.set(state=server.state)  # "QUEUED (Resources)" while a Slurm job waits, else "starting"
            p.log.reset(f"{server.name}: server.log")
            self.monitor = ServerMonitor(server, p.log, p.gpu_chart, preflight=predicted, label=label).start()
            self.update_buttons()
            while server.stopped is None and server.state.startswith("QUEUED"):
                time.sleep(QUEUE_POLL_S)  # the badge follows Slurm's reason until the job runs
                p.badge.set(state=server.state)
            server.wait(self.ready_timeout_s, stall_after_s=self.stall_after_s)
            if not server.ready:
                self.monitor.finish()  # the last lines (the traceback) are in the pane before the card
            p.badge.set(state=server.state)
            if server.readiness is not None:
                p.results.add(server.readiness._repr_html_(), f"{server.name}: {server.state}")

        p.jobs.start("launch", run)

    def stop(self) -> None:
        server = self.server
        if server is None or server.stopped is not None:
            return
        p = self.panel
        p.badge.set(activity="stopping…")

        def run() -> None:
            try:
                server.stop(grace_s=STOP_GRACE_S)
                p.badge.set(state=server.state)
                p.results.add(hv.card(f"server {server.name}", hv.p("stopped")), f"{server.name} stopped")
            except Exception as exc:
                p.results.error("stop", exc)
            finally:
                self.update_buttons()

        self._stopping = threading.Thread(target=run, name="dsv4lab-stop", daemon=False)
        self._stopping.start()

    def bench(self) -> None:
        p = self.panel
        server, levels = self.server, p.concurrency
        if server is None or levels is None:
            return

        def run() -> None:
            runs = server.bench(concurrency=levels)
            p.results.add(
                runs._repr_html_(),
                "benchmark runs: "
                + ", ".join(
                    f"C={r.concurrency} {fmt_tok_s(r.on_hardware.output_throughput)}{r.clock.tag}" for r in runs
                ),
            )
            p.results.add(self._bench_chart(runs), "benchmark chart")

        p.jobs.start("bench", run)

    def _bench_chart(self, runs: Any) -> str:
        from dsv4lab import plots

        measured = {f"{r.label} C={r.concurrency}": r.on_hardware.output_throughput for r in runs if not r.partial}
        try:
            return plots.svg_figure(plots.roofline_gap(measured, clock=runs[0].clock if runs else None))
        except Exception as exc:  # the table is the result; a chart that fails says why
            return hv.p(f"no chart: {exc}")

    def diagnose(self) -> None:
        p, server = self.panel, self.server
        if server is None:
            return
        p.jobs.start("diagnose", lambda: p.results.add(server.diagnose()._repr_html_(), f"diagnosis of {server.name}"))

    # -- files and experiments --------------------------------------------------------------------------------

    def save(self) -> Path | None:
        from dsv4lab.config.server_config import save

        p = self.panel
        if p.config is None:
            return None
        path = Path(str(self.save_path.value).strip() or "panel-config.toml").expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        save(p.config, path)
        shown = p.config.to_toml(redact=True)  # the file keeps its secrets (0600); the card is an output
        body = hv.p(f"written to {path.resolve()}") + hv.pre(shown.splitlines())
        p.results.add(hv.card("config saved", body, state="ok"), f"saved {path}")
        return path

    def script(self) -> str | None:
        from dsv4lab.config.launch_script import render_launch_script

        p = self.panel
        if p.config is None:
            return None
        name = p.preset_name.replace("_", "-")
        text = render_launch_script(p.config, run_dir=f"~/dsv4lab-runs/{name}", sglang_version=p.sglang_version)
        head = hv.p(f"For a real host with SGLang {p.sglang_version}: save as launch.sh and run it there.")
        p.results.add(hv.card("launch.sh", head + hv.pre(text.splitlines()), state="info"), text)
        return text

    def experiment(self) -> None:
        p = self.panel
        notebook = Path(str(self.notebook_picker.value))
        if p.config is None or not str(self.notebook_picker.value):
            return
        levels = p.concurrency or [1]
        params = ex.experiment_parameters(
            preset=p.preset_name,
            changes=p.changes,
            host=self.host_name(),
            target=self.lab_target(),
            hardware=p.hardware,
            sglang_version=p.sglang_version,
            pace=self.lab_pace(),
            concurrency=levels,
            declared=ex.declared_parameters(notebook),
        )

        def run() -> None:
            try:
                result = ex.run_experiment(notebook, params, self.reports_root)
            except ImportError as exc:
                msg = f"the experiment runner (dsv4lab.notebook.nbrun) is not available in this version: {exc}"
                p.results.add(hv.card(f"experiment {notebook.stem}", hv.p(msg), state="warn"), msg)
                return
            p.results.add(ex.experiment_card(notebook, params, result), f"experiment {notebook.stem}")

        p.jobs.start("experiment", run)

    def lab_target(self) -> str:
        given = self.panel.given_lab
        return str(given.target) if given is not None else self.panel.target

    def lab_pace(self) -> float | None:
        given = self.panel.given_lab
        return given.pace if given is not None else self.panel.pace

    # -- teardown ------------------------------------------------------------------------------------------

    def close(self, *, stop_server: bool) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if stop_server and self.server is not None and self.server.stopped is None:
            with contextlib.suppress(Exception):
                self.server.stop(grace_s=STOP_GRACE_S)
        for lab in self.labs.values():
            with contextlib.suppress(Exception):
                lab.close()
        self.labs.clear()
