"""``ConfigPanel``: tweak a server config with widgets, see before launching whether it fits, then run it.

The story's person changed ``--mem-fraction-static`` and ``--cuda-graph-max-bs`` by hand, relaunched and
waited five minutes to learn whether it fit. Here every change re-runs the memory preflight (debounced;
well under 100 ms on the kernel thread) and says at once "OOM in cuda_graph_capture on GPU 1, short by
10.6 GiB", with the fixes :func:`~dsv4lab.model.memory.suggest` finds as buttons. Launch, Stop, Bench and
Diagnose run the same :class:`~dsv4lab.notebook.lab.Lab` calls a notebook cell would, in a worker thread, so the
kernel stays free for the next click; the log streams in while the server starts.

The panel holds a config *as it would run on the real host* (the presets' kernel-config folder, no twin
settings): the saved TOML, the launch script and "Open as experiment" all use it, and only the launch
maps it onto the session (the twin's kernel configs, a free port).
"""

from __future__ import annotations

import html
import re
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as widgets

from dsv4lab import htmlview as hv
from dsv4lab.config.hardware import HARDWARE, hardware_profile
from dsv4lab.config.presets import PRESETS
from dsv4lab.config.presets import preset as load_preset
from dsv4lab.config.server_config import ConfigDiff, ServerConfig, diff
from dsv4lab.config.versions import RELEASES, resolve_release
from dsv4lab.errors import ConfigError, UnknownNameError
from dsv4lab.model.memory import Preflight, Suggestion, preflight, suggest
from dsv4lab.notebook.widgets.actions import Jobs, ResultsPane, StateBadge
from dsv4lab.notebook.widgets.chartslot import ChartSlot
from dsv4lab.notebook.widgets.controls import FieldControl, build_controls, nested_prefixes
from dsv4lab.notebook.widgets.logpane import LogPane
from dsv4lab.notebook.widgets.preflight_view import PreflightView
from dsv4lab.notebook.widgets.server_actions import ServerActions

__all__ = ["PRESET_LABELS", "PROMINENT", "ConfigPanel"]

#: Shown first, in this order: the fields the story's fix turned. Every other field (a new one included)
#: goes under "More settings"; nested blocks (speculative) get their own box.
PROMINENT = (
    "mem_fraction_static",
    "cuda_graph_max_bs",
    "cuda_graph_bs",
    "disable_cuda_graph",
    "max_running_requests",
    "chunked_prefill_size",
    "context_length",
    "kv_cache_dtype",
)

#: The presets as the story names them, in the panel's dropdown.
PRESET_LABELS = {"config_a": "Config A", "config_b": "Config B", "config_b_fixed": "Config B-fixed"}

#: A nested block whose switch field is unset is off: its other fields are not applied (and greyed out),
#: so choosing "(unset)" as the speculative algorithm turns speculation off in one click.
SWITCHES = {"speculative": "speculative.algorithm"}

#: SGLang's choice for an unset field, as the preflight resolved it.
_RESOLVED = {
    "mem_fraction_static": lambda s: f"{s.mem_fraction_static:.3f}",
    "cuda_graph_max_bs": lambda s: str(s.cuda_graph_max_bs),
    "chunked_prefill_size": lambda s: str(s.chunked_prefill_size),
    "max_running_requests": lambda s: str(s.max_running_requests),
}


class ConfigPanel:
    """A config form over a lab: live memory preflight, suggested fixes, and launch / stop / bench / diagnose.

    Example::

        panel = ConfigPanel(Lab(pace=0.05, progress=False), preset="config_b_fixed")
        panel                                   # the form; or headless:
        panel.set(cuda_graph_max_bs=None)       # -> panel.verdict == "fail", panel.suggestions
        panel.suggestion_buttons[0].click()     # -> "ok"
        panel.buttons["launch"].click(); panel.wait_idle(120)   # -> panel.state == "READY"

    Args:
        lab: the session to launch on; by default one is made at the first launch from ``host``,
            ``target``, ``pace`` and ``run_root`` (and another when the hardware or release picker
            changes). The panel draws its own progress, so it turns the lab's progress lines off: drawn
            from a worker thread they would land in whichever cell runs.
        preset: the starting config, also what "changes" are measured against.
        concurrency: the Bench levels (also the concurrency the suggestions plan for).
        debounce_s: how long after the last change the preflight runs (0: at once, on the same thread).
        ready_timeout_s, stall_after_s: the launch watcher's limits.
        notebooks_dir: where the experiment notebooks are (default: the current folder if it has them,
            else the repository's ``notebooks/``); reports_root: where their reports go.
        charts: draw the budget and GPU-memory charts (off for timing the preflight alone).
    """

    def __init__(
        self,
        lab: Any = None,
        *,
        host: str = "local",
        target: str = "twin",
        hardware: str | None = None,
        sglang_version: str | None = None,
        pace: float | None = 0.05,
        preset: str = "config_b_fixed",
        concurrency: Sequence[int] | str = (1, 16),
        run_root: str | Path = "runs",
        notebooks_dir: str | Path | None = None,
        reports_root: str | Path = "reports",
        debounce_s: float = 0.05,
        ready_timeout_s: float = 900.0,
        stall_after_s: float = 300.0,
        charts: bool = True,
    ) -> None:
        if preset not in PRESETS:
            raise UnknownNameError("preset", preset, PRESETS)
        if lab is not None:
            lab.progress = False
            hardware = hardware or lab.hardware.name
            sglang_version = sglang_version or lab.sglang_version
        self.host = host
        self.target = target
        #: The twin's pace: the panel watches servers start and crash live, which needs wall time.
        self.pace = pace
        self.run_root = run_root
        self.debounce_s = debounce_s
        self.charts = charts
        self.given_lab = lab
        self.preset_name = preset
        self.preset_config: ServerConfig = load_preset(preset)
        release = resolve_release(sglang_version, warn=False)
        #: How many preflights ran, and how long the last one took on its thread (config, preflight,
        #: suggestions, verdict; the charts follow in their own thread).
        self.refreshes = 0
        self.last_refresh_s: float | None = None
        self._config: ServerConfig | None = None
        self._preflight: Preflight | None = None
        self._suggestions: list[Suggestion] = []
        self._changes: ConfigDiff = ConfigDiff(())
        # Set while the panel itself moves controls (a preset, a suggestion, a parked default), per thread:
        # widget observers run in the thread that set the value, so a user's change on the kernel thread
        # is never mistaken for the panel's own while a debounced preflight runs in the timer thread.
        self._quiet = threading.local()
        self._timer: threading.Timer | None = None
        self._timer_lock = threading.Lock()
        self._refresh_lock = threading.Lock()
        self._refreshed = threading.Event()
        self._refreshed.set()

        # -- header: what to start from, where it runs ---------------------------------------------------
        self.preset_picker = widgets.Dropdown(
            options=[(PRESET_LABELS.get(k, k), k) for k in PRESETS], value=preset, description="preset"
        )
        self.hardware_picker = widgets.Dropdown(
            options=list(HARDWARE), value=hardware or "rtx-pro-6000-x8", description="hardware"
        )
        self.version_picker = widgets.Dropdown(
            options=[r.version for r in RELEASES], value=release.version, description="SGLang"
        )
        self.concurrency_box = widgets.Text(
            value=" ".join(str(c) for c in concurrency) if not isinstance(concurrency, str) else concurrency,
            description="bench at",
            tooltip="concurrency levels for Bench, e.g. 1 16",
            continuous_update=False,
        )
        self.concurrency_error = widgets.HTML("")
        for w in (self.preset_picker, self.hardware_picker, self.version_picker, self.concurrency_box):
            w.style = {"description_width": "5em"}
            w.layout = widgets.Layout(width="17em")
        self.preset_picker.add_class("dsv4lab-preset")
        self.hardware_picker.add_class("dsv4lab-hardware")
        self.concurrency_box.add_class("dsv4lab-concurrency")

        # -- the form, generated from the dataclass ---------------------------------------------------
        self.controls: dict[str, FieldControl] = build_controls(release)
        self.view = PreflightView(self.apply)
        self.log = LogPane()
        self.gpu_chart = ChartSlot(
            "the GPU memory chart appears here while a server starts", css_class="dsv4lab-gpu-chart"
        )
        self.results = ResultsPane()
        self.badge = StateBadge()
        self.jobs = Jobs(self.results, self._update_buttons)
        self.actions = ServerActions(
            self,
            notebooks_dir=notebooks_dir,
            reports_root=reports_root,
            ready_timeout_s=ready_timeout_s,
            stall_after_s=stall_after_s,
        )
        self.buttons = self.actions.buttons
        self.widget = self._layout()
        self.widget.add_class("dsv4lab-panel")

        self._load(self.preset_config)
        for c in self.controls.values():
            c.observe(self._changed)
        self.preset_picker.observe(self._on_preset, names="value")
        self.hardware_picker.observe(lambda _c: self._changed(), names="value")
        self.version_picker.observe(self._on_version, names="value")
        self.concurrency_box.observe(lambda _c: self._changed(), names="value")
        self.refresh()

    # -- state ------------------------------------------------------------------------------------------

    @property
    def config(self) -> ServerConfig | None:
        """The config the controls describe (None while a control holds an invalid value)."""
        return self._config

    @property
    def preflight(self) -> Preflight | None:
        return self._preflight

    @property
    def suggestions(self) -> list[Suggestion]:
        return list(self._suggestions)

    @property
    def suggestion_buttons(self) -> list[Any]:
        return list(self.view.suggestion_buttons)

    @property
    def changes(self) -> ConfigDiff:
        """The config against the chosen preset."""
        return self._changes

    @property
    def verdict(self) -> str:
        """``ok`` (fits), ``fail`` (predicted OOM) or ``invalid`` (a control holds a bad value)."""
        return self.view.state

    @property
    def state(self) -> str:
        """The badge: ``no server``, ``starting``, ``READY``, ``CRASHED``, ``STALLED``, ``stopped`` ..."""
        return self.badge.state

    @property
    def server(self) -> Any:
        return self.actions.server

    @property
    def hardware(self) -> str:
        return str(self.hardware_picker.value)

    @property
    def sglang_version(self) -> str:
        return str(self.version_picker.value)

    @property
    def concurrency(self) -> list[int] | None:
        """The Bench levels (None while the box holds something else)."""
        words = [w for w in re.split(r"[,\s]+", str(self.concurrency_box.value).strip()) if w]
        try:
            levels = [int(w) for w in words]
        except ValueError:
            return None
        return levels if levels and all(c >= 1 for c in levels) else None

    def errors(self) -> dict[str, str]:
        """The messages shown at controls now, by field name."""
        out = {}
        for name, c in self.controls.items():
            m = re.search(r"✗ (.*)</div>", c.error.value)
            if m:
                out[name] = html.unescape(m.group(1))
        return out

    # -- changes ----------------------------------------------------------------------------------------

    def set(self, **values: Any) -> None:
        """Set controls by field name (``speculative__num_steps`` or ``"speculative.num_steps"`` via a
        dict), as if the user had; one preflight follows."""
        names = {k.replace("__", "."): v for k, v in values.items()}
        unknown = [n for n in names if n not in self.controls]
        if unknown:
            raise UnknownNameError("panel field", unknown[0], self.controls, field=unknown[0])
        self._quiet.on = True
        try:
            for name, value in names.items():
                self.controls[name].set_value(value)
        finally:
            self._quiet.on = False
        self._changed()

    def apply(self, changes: Mapping[str, Any]) -> None:
        """Apply a suggestion's changes (the suggestion buttons call this; a failure becomes a card)."""
        try:
            self.set(**{k.replace(".", "__"): v for k, v in changes.items()})
        except Exception as exc:  # a click handler's exception would vanish in JupyterLab
            self.results.error("apply suggestion", exc)

    def _changed(self) -> None:
        if getattr(self._quiet, "on", False):
            return
        if self.debounce_s <= 0:
            self._timer_fired()
            return
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
            self._refreshed.clear()
            self._timer = threading.Timer(self.debounce_s, self._timer_fired)
            self._timer.daemon = True
            self._timer.start()

    def _timer_fired(self) -> None:
        try:
            self.refresh()
        except Exception as exc:  # never lost: the results pane shows it
            self.results.error("preflight", exc)

    def _on_preset(self, change: Mapping[str, Any]) -> None:
        self.preset_name = str(change["new"])
        self.preset_config = load_preset(self.preset_name)
        self._load(self.preset_config)
        self.actions.select_notebook(self.preset_name)
        self._changed()

    def _on_version(self, change: Mapping[str, Any]) -> None:
        release = resolve_release(str(change["new"]), warn=False)
        self._quiet.on = True
        try:
            for c in self.controls.values():
                c.set_release(release)
        finally:
            self._quiet.on = False
        self._changed()

    def _load(self, config: ServerConfig) -> None:
        self._quiet.on = True
        try:
            for name, c in self.controls.items():
                value: Any = config
                for part in name.split("."):
                    value = getattr(value, part, None) if value is not None else None
                c.set_value(value)
        finally:
            self._quiet.on = False

    # -- the preflight ------------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Rebuild the config from the controls and redraw the prediction now (the debounce calls this)."""
        with self._refresh_lock:
            start = time.perf_counter()
            try:
                self._refresh()
            finally:
                self.refreshes += 1
                self.last_refresh_s = time.perf_counter() - start
                with self._timer_lock:
                    if self._timer is None or not self._timer.is_alive() or self._timer is threading.current_thread():
                        self._refreshed.set()
        self._update_buttons()

    def _refresh(self) -> None:
        levels = self.concurrency
        bad_levels = "✗ concurrency levels: whole numbers ≥ 1, e.g. 1 16"
        self.concurrency_error.value = (
            "" if levels is not None else f"<span style='color:#cf222e;font-size:0.85em'>{bad_levels}</span>"
        )
        hw = hardware_profile(self.hardware)
        version = self.sglang_version
        for c in self.controls.values():
            c.show_error(None)
        try:
            config = self._collect()
            p = preflight(config, hw, sglang_version=version)
        except ConfigError as exc:
            self._config, self._preflight, self._suggestions = None, None, []
            self._show_error(exc)
            self.view.show_invalid(exc)
            return
        suggestions: list[Suggestion] = []
        if not p.fits:
            try:
                suggestions = suggest(config, hw, sglang_version=version, concurrency=max(levels) if levels else None)
            except ConfigError:
                suggestions = []
        changes = diff(self.preset_config, config)
        self._config, self._preflight, self._suggestions, self._changes = config, p, suggestions, changes
        self.view.show(p, suggestions, changes, PRESET_LABELS.get(self.preset_name, self.preset_name))
        self._show_resolved(p)
        if self.charts:
            label = PRESET_LABELS.get(self.preset_name, self.preset_name) + (" (tweaked)" if changes else "")

            def build() -> Any:
                from dsv4lab.plots import memory_budget

                return memory_budget({label: (p, None)}, gpus="focus")

            self.view.chart.request(build)

    def _collect(self) -> ServerConfig:
        off = {
            block
            for block, switch in SWITCHES.items()
            if switch in self.controls and self.controls[switch].value() is None
        }
        values: dict[str, Any] = {}
        for name, c in self.controls.items():
            block_off = name.split(".")[0] in off and name not in SWITCHES.values()
            c.input.disabled = block_off or (c.toggle is not None and not c.toggle.value)
            if c.toggle is not None:
                c.toggle.disabled = block_off
            if block_off:
                values[name] = None
                continue
            refused = c.check()
            if refused:
                raise ConfigError(name, c.input.value, refused)
            values[name] = c.value()
        return self.preset_config.with_values(values)

    def _show_error(self, exc: ConfigError) -> None:
        field = exc.field.split("/")[0]
        head = field.split(".")[0]
        for candidate in (field, head if head in ("env",) else ""):
            if candidate in self.controls:
                self.controls[candidate].show_error(str(exc))
                return
        for name, c in self.controls.items():  # e.g. "speculative" itself: its first control
            if name.startswith(field + "."):
                c.show_error(str(exc))
                return
        self.results.add(hv.card("config", hv.p(str(exc)), state="fail"), str(exc))

    def _show_resolved(self, p: Preflight) -> None:
        self._quiet.on = True  # parking a slider is not a change of the config
        try:
            for name, c in self.controls.items():
                pick = _RESOLVED.get(name)
                unset = pick is not None and c.kind == "slider" and c.value() is None
                c.show_note(f"unset: SGLang picks {pick(p.settings)}" if unset and pick is not None else "")
                if unset:
                    c.show_default(getattr(p.settings, name, None))
        finally:
            self._quiet.on = False

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Block until the pending preflight, the running action and the charts are done (tests, scripts)."""
        deadline = time.monotonic() + timeout_s
        parts = (
            lambda t: self._refreshed.wait(t),
            self.jobs.wait_idle,
            self.view.chart.wait_idle,
            self.gpu_chart.wait_idle,
        )
        return all(wait(max(0.0, deadline - time.monotonic())) for wait in parts)

    # -- buttons -------------------------------------------------------------------------------------------

    def _update_buttons(self) -> None:
        self.actions.update_buttons()

    # -- layout --------------------------------------------------------------------------------------------

    def _layout(self) -> Any:
        def box(title: str, children: Sequence[Any]) -> Any:
            head = widgets.HTML(f"<div style='font-weight:700;margin:0.3em 0 0.2em 0'>{html.escape(title)}</div>")
            return widgets.VBox(
                [head, *children],
                layout=widgets.Layout(border="1px solid #d0d7de", padding="0 0.6em 0.3em 0.6em", margin="0 0 0.4em 0"),
            )

        prominent = [self.controls[n].widget for n in PROMINENT if n in self.controls]
        nested = nested_prefixes()
        blocks = [
            box(
                f"{prefix.capitalize()} decoding" if prefix == "speculative" else prefix,
                [c.widget for n, c in self.controls.items() if n.startswith(prefix + ".")],
            )
            for prefix in nested
        ]
        rest = [
            c.widget
            for n, c in self.controls.items()
            if n not in PROMINENT and not any(n.startswith(p + ".") for p in nested)
        ]
        more = widgets.Accordion(children=[widgets.VBox(rest)], titles=("More settings",))
        more.selected_index = None
        left = widgets.VBox(
            [box("Memory and CUDA graphs", prominent), *blocks, more],
            layout=widgets.Layout(width="56%", padding="0 0.8em 0 0"),
        )
        right = widgets.VBox([self.view.widget], layout=widgets.Layout(width="44%"))
        header = widgets.HBox(
            [self.preset_picker, self.hardware_picker, self.version_picker, self.concurrency_box],
            layout=widgets.Layout(flex_flow="row wrap"),
        )
        title = widgets.HTML(
            "<div style='font-size:1.2em;font-weight:700;font-family:system-ui,sans-serif;margin-bottom:0.2em'>"
            "dsv4lab — tweak a server config</div>"
        )
        # The log and the GPU chart full width, one above the other: the timeline is wide, and its phase
        # labels would be unreadable squeezed into half the row.
        monitor = widgets.VBox([self.log.widget, self.gpu_chart.widget], layout=widgets.Layout(width="100%"))
        return widgets.VBox(
            [
                title,
                header,
                self.concurrency_error,
                widgets.HBox([left, right]),
                self.actions.widget,
                monitor,
                self.results.widget,
            ]
        )

    # -- display and teardown -------------------------------------------------------------------------------

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"ConfigPanel({self.preset_name}, {self.verdict}, server {self.state})"

    def close(self, *, stop_server: bool = True) -> None:
        """Stop the panel's threads (and its server, unless ``stop_server=False``), close labs it made."""
        with self._timer_lock:
            if self._timer is not None:
                self._timer.cancel()
        self.actions.close(stop_server=stop_server)
