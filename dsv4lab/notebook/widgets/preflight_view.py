"""The right half of the panel: will this config start, by how much does it miss, and what would fix it.

It shows what :func:`dsv4lab.model.memory.preflight` predicts for the GPU that decides (the failing one, else
the tightest): a green or red verdict in the words the story needed ("OOM in cuda_graph_capture on GPU 1,
short by 10.6 GiB"), :func:`dsv4lab.model.memory.suggest`'s fixes as buttons that set the controls, the changes
against the chosen preset as the flags they would add to the launch line, and the budget chart from
:func:`dsv4lab.plots.memory_budget`. It only draws; the panel decides when and hands over the results.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets

from dsv4lab.config.server_config import ConfigChange, ConfigDiff
from dsv4lab.config.versions import SGLangRelease
from dsv4lab.errors import ConfigError
from dsv4lab.model.memory import Preflight, Suggestion
from dsv4lab.notebook.widgets.chartslot import ChartSlot

__all__ = ["PreflightView", "change_as_flag", "verdict_text"]

_GREEN, _RED, _GREY = "#1a7f37", "#cf222e", "#57606a"


def verdict_text(p: Preflight) -> str:
    """One line: "fits, x GiB to spare on GPU n" or "OOM in <phase> on GPU n, short by x GiB"."""
    failing = p.failing_gpu
    if failing is not None:
        return f"OOM in {failing.fail_phase} on GPU {failing.gpu}, short by {failing.short_by_gib or 0:.1f} GiB"
    tight = min(p.per_gpu, key=lambda g: g.headroom_gib)
    return f"fits, {tight.headroom_gib:.1f} GiB to spare on GPU {tight.gpu} (the tightest)"


def _fmt(value: Any) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


def change_as_flag(change: ConfigChange, release: SGLangRelease) -> str:
    """A change as it reads on the launch line: ``--flag value``, ``--flag``, or ``(drop --flag)``."""
    flag = release.flag_for(change.field)
    after = change.after
    if flag is None:  # env, files, extra args: not a flag of their own
        return f"{change.field}={_fmt(after)}"
    if after is None or after is False or after == []:
        return f"(drop {flag})"
    if after is True:
        return flag
    return f"{flag} {_fmt(after)}"


class PreflightView:
    """Verdict, suggestion buttons, flags against the preset, and the budget chart of the deciding GPU."""

    def __init__(self, on_apply: Callable[[Mapping[str, Any]], None]) -> None:
        self._on_apply = on_apply
        self.verdict = widgets.HTML(self._banner("…", _GREY, "none"))
        self.verdict.add_class("dsv4lab-verdict")
        self.details = widgets.HTML("")
        self.suggestions_box = widgets.VBox([])
        self.suggestions_box.add_class("dsv4lab-suggestions")
        self.flags = widgets.HTML("")
        self.flags.add_class("dsv4lab-flags")
        self.chart = ChartSlot("the budget chart appears here", css_class="dsv4lab-budget-chart")
        self.suggestion_buttons: list[Any] = []
        self.state = "none"
        self.widget = widgets.VBox(
            [self.verdict, self.details, self.suggestions_box, self.flags, self.chart.widget],
            layout=widgets.Layout(width="100%"),
        )

    # -- drawing -----------------------------------------------------------------------------------------

    def show(self, p: Preflight, suggestions: Sequence[Suggestion], changes: ConfigDiff, preset: str) -> None:
        """Draw a prediction: the verdict, the numbers behind it, the fixes, the flags."""
        fits = p.fits
        self.state = "ok" if fits else "fail"
        head = ("✓ " if fits else "✗ ") + verdict_text(p)
        self.verdict.value = self._banner(head, _GREEN if fits else _RED, self.state)
        s = p.settings
        worst = p.failing_gpu or min(p.per_gpu, key=lambda g: g.headroom_gib)
        need = worst.comm_gib + worst.graphs_gib
        facts = [
            f"GPU {worst.gpu}: {worst.free_before_load_gib:.1f} GiB free before load",
            f"weights + KV capped at {s.mem_fraction_static:.2f} × that"
            + (" (SGLang's default fraction)" if s.mem_fraction_is_default else ""),
            f"slack {worst.slack_gib:.1f} GiB for graphs and buffers, which need {need:.1f} GiB"
            f" (graphs up to bs {s.cuda_graph_max_bs})",
            f"KV pool {p.kv_tokens:,} tokens",
        ]
        self.details.value = (
            f"<div style='color:{_GREY};font-size:0.85em;margin:0.3em 0;line-height:1.4'>"
            + " · ".join(html.escape(f) for f in facts)
            + f"<br>{html.escape(p.hardware)}, {html.escape(p.model)}, SGLang {html.escape(p.sglang_version)}</div>"
        )
        self._show_suggestions(suggestions, p.sglang_version)
        self._show_changes(changes, preset, p.sglang_version)

    def show_invalid(self, error: ConfigError) -> None:
        """The config cannot be built: say so instead of a stale verdict (the control shows the detail)."""
        self.state = "invalid"
        self.verdict.value = self._banner(f"! invalid {error.field}: fix it to see the preflight", "#9a6700", "invalid")
        self.details.value = ""
        self._show_suggestions([], None)
        self.chart.show_message("no chart while the config is invalid")

    def _show_suggestions(self, suggestions: Sequence[Suggestion], version: str | None) -> None:
        rows: list[Any] = []
        self.suggestion_buttons = []
        if suggestions:
            rows.append(widgets.HTML("<b style='font-size:0.9em'>Predicted to fit (click to apply):</b>"))
        for s in suggestions:
            text = ", ".join(f"{k} = {_fmt(v)}" for k, v in s.changes.items())
            button = widgets.Button(description=text, tooltip=s.why, button_style="success")
            button.layout = widgets.Layout(width="auto", flex="0 0 auto")
            button.add_class("dsv4lab-suggestion")
            button.on_click(lambda _b, changes=dict(s.changes): self._on_apply(changes))
            self.suggestion_buttons.append(button)
            note = widgets.HTML(
                f"<span style='font-size:0.85em;color:{_GREY};line-height:1.3'>"
                f"<code>{html.escape(s.as_flags(version))}</code>"
                f" — {s.preflight.min_headroom_gib:.1f} GiB to spare</span>"
            )
            why = widgets.HTML(
                f"<div style='font-size:0.8em;color:{_GREY};margin:0 0 0.3em 0.5em;line-height:1.3'>"
                f"{html.escape(s.why)}</div>"
            )
            rows.append(widgets.VBox([widgets.HBox([button, note], layout=widgets.Layout(align_items="center")), why]))
        self.suggestions_box.children = tuple(rows)

    def _show_changes(self, changes: ConfigDiff, preset: str, version: str) -> None:
        from dsv4lab.config.versions import resolve_release

        release = resolve_release(version, warn=False)
        if not changes:
            self.flags.value = f"<div style='font-size:0.85em;color:{_GREY}'>Same as {html.escape(preset)}.</div>"
            return
        items = "".join(
            f"<li><code>{html.escape(change_as_flag(c, release))}</code>"
            f" <span style='color:{_GREY}'>({html.escape(c.field)}: {html.escape(_fmt(c.before))} → "
            f"{html.escape(_fmt(c.after))})</span></li>"
            for c in changes
        )
        self.flags.value = (
            f"<div style='font-size:0.85em;line-height:1.4'><b>Changes against {html.escape(preset)}:</b>"
            f"<ul style='margin:0.1em 0 0.3em 1.2em;padding:0'>{items}</ul></div>"
        )

    @staticmethod
    def _banner(text: str, colour: str, state: str) -> str:
        return (
            f"<div data-state='{state}' style='background:{colour};color:white;font-weight:600;font-size:1.05em;"
            f"padding:0.45em 0.7em;border-radius:4px;font-family:system-ui,sans-serif'>{html.escape(text)}</div>"
        )
