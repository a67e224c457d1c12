"""One control per config field, generated from the dataclass: type, bounds, choices and help text.

The panel must not need editing when :class:`~dsv4lab.config.server_config.ServerConfig` gains a field, so nothing here
names the fields it draws except to refine them: a field's *type* picks the control (``bool`` a checkbox,
a bounded number a slider, text and lists a text box, a mapping a ``NAME=value`` box, a nested dataclass
its own block), its ``metadata["help"]`` is the grey line under it, and bounds, units and allowed choices
come from the field's metadata (``min``, ``max``, ``step``, ``unit``, ``choices``) when it has them, else
from the small tables below, else the control is a plain text box that the config's own parser reads.
Choices that depend on the SGLang release (KV-cache dtypes, quantizations, speculative algorithms) come
from :mod:`dsv4lab.config.versions`, so a dropdown never offers what the chosen release would refuse.

Optional numbers are a slider plus a "set" checkbox: unchecked means unset, which lets SGLang pick (the
panel then shows what it would pick). A value the user cannot mean (text in an integer box, a line
without ``=`` in the environment box) is a :class:`~dsv4lab.errors.ConfigError` from :meth:`FieldControl.value`,
which the panel shows at the control.
"""

from __future__ import annotations

import dataclasses
import html
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import ipywidgets as widgets

from dsv4lab.config.server_config import ServerConfig
from dsv4lab.config.versions import SGLangRelease
from dsv4lab.errors import ConfigError

__all__ = [
    "CHOICES_BY_RELEASE",
    "RANGES",
    "UNITS",
    "UNSET",
    "FieldControl",
    "FieldSpec",
    "Range",
    "build_controls",
    "field_specs",
    "nested_prefixes",
]

Kind = Literal["slider", "checkbox", "dropdown", "text", "env"]


@dataclass(frozen=True)
class Range:
    """Slider bounds for a number field (the validator in ``config`` stays the judge of what is valid)."""

    lo: float
    hi: float
    step: float
    unit: str = ""


#: Slider bounds for the fields people move; a field that is not here (and has no ``min``/``max``
#: metadata) gets a text box, which accepts anything the config's parser reads.
RANGES: dict[str, Range] = {
    "mem_fraction_static": Range(0.05, 0.95, 0.01, "of free GPU memory"),
    "cuda_graph_max_bs": Range(1, 512, 1, "requests"),
    "max_running_requests": Range(1, 1024, 1, "requests"),
    "tp": Range(1, 16, 1, "GPUs"),
    "dp": Range(1, 8, 1, "replicas"),
    "nnodes": Range(1, 8, 1, "nodes"),
    "node_rank": Range(0, 7, 1, ""),
    "speculative.num_steps": Range(1, 8, 1, "draft steps"),
    "speculative.eagle_topk": Range(1, 8, 1, "branches"),
    "speculative.num_draft_tokens": Range(1, 16, 1, "tokens"),
}

#: Units of text fields, shown after the box.
UNITS: dict[str, str] = {
    "chunked_prefill_size": "tokens (-1 = no chunking)",
    "context_length": "tokens",
    "cuda_graph_bs": "batch sizes, e.g. 1,2,4,8",
    "port": "(the lab picks a free one at launch)",
    "env_files": "paths, comma-separated",
    "extra_args": "flags, comma-separated",
}

#: Fields whose allowed values differ per SGLang release: the release attribute that lists them.
CHOICES_BY_RELEASE: dict[str, str] = {
    "kv_cache_dtype": "kv_cache_dtypes",
    "quantization": "quantizations",
    "speculative.algorithm": "speculative_algorithms",
}


@dataclass(frozen=True)
class FieldSpec:
    """What the dataclass says about one (possibly nested, dotted) field."""

    name: str
    type: Any
    optional: bool
    help: str
    metadata: Mapping[str, Any]


def _unwrap(tp: Any) -> tuple[Any, bool]:
    """``int | None`` -> ``(int, True)``; anything else as it is."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def field_specs(cls: type = ServerConfig, prefix: str = "") -> list[FieldSpec]:
    """Every leaf field of ``cls`` in declaration order; nested dataclasses are flattened to dotted names."""
    hints = typing.get_type_hints(cls)
    out: list[FieldSpec] = []
    for f in dataclasses.fields(cls):
        tp, optional = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            out.extend(field_specs(tp, prefix=f"{prefix}{f.name}."))
            continue
        out.append(FieldSpec(prefix + f.name, tp, optional, str(f.metadata.get("help", "")), f.metadata))
    return out


def _range_for(spec: FieldSpec) -> Range | None:
    md = spec.metadata
    if spec.type not in (int, float):
        return None
    if "min" in md and "max" in md:
        step = md.get("step", 1 if spec.type is int else 0.01)
        return Range(float(md["min"]), float(md["max"]), float(step), str(md.get("unit", "")))
    return RANGES.get(spec.name)


def _choices_for(spec: FieldSpec, release: SGLangRelease) -> tuple[str, ...] | None:
    if "choices" in spec.metadata:
        return tuple(str(c) for c in spec.metadata["choices"])
    attr = CHOICES_BY_RELEASE.get(spec.name)
    if attr is None:
        return None
    return tuple(getattr(release, attr))


_LABEL_W = "12.5em"
_INPUT_W = "14em"

#: The dropdown entry for "unset" (ipywidgets reads a None value as "nothing selected").
UNSET = "(unset)"


class FieldControl:
    """The control of one field: a row with its label, the input, a unit or note, its help and its error."""

    def __init__(self, spec: FieldSpec, release: SGLangRelease) -> None:
        self.spec = spec
        self.name = spec.name
        self.release = release
        self.choices = _choices_for(spec, release)
        self.range = _range_for(spec)
        self.kind: Kind
        self.toggle: Any = None
        tooltip = spec.help or spec.name
        if spec.type is bool:
            self.kind = "checkbox"
            self.input: Any = widgets.Checkbox(value=False, indent=False, layout=widgets.Layout(width="auto"))
        elif self.choices is not None:
            self.kind = "dropdown"
            self.input = widgets.Dropdown(options=self._options(self.choices), layout=widgets.Layout(width=_INPUT_W))
        elif self.range is not None:
            self.kind = "slider"
            r = self.range
            common: dict[str, Any] = {"continuous_update": False, "layout": widgets.Layout(width=_INPUT_W)}
            if spec.type is int:
                self.input = widgets.IntSlider(
                    value=int(r.lo), min=int(r.lo), max=int(r.hi), step=int(r.step), **common
                )
            else:
                self.input = widgets.FloatSlider(
                    value=r.lo, min=r.lo, max=r.hi, step=r.step, readout_format=".2f", **common
                )
            if spec.optional:
                self.toggle = widgets.Checkbox(
                    value=True, indent=False, description="", tooltip="set (unchecked: unset, SGLang picks)"
                )
                self.toggle.layout = widgets.Layout(width="1.6em")
                self.toggle.add_class("dsv4lab-set")
        elif spec.type is Mapping or typing.get_origin(spec.type) is Mapping:
            self.kind = "env"
            self.input = widgets.Textarea(
                placeholder="NAME=value, one per line", rows=2, layout=widgets.Layout(width=_INPUT_W)
            )
        else:
            self.kind = "text"
            self.input = widgets.Text(
                placeholder="unset" if spec.optional else "",
                continuous_update=False,
                layout=widgets.Layout(width=_INPUT_W),
            )
        self.input.tooltip = tooltip
        unit = self.range.unit if self.range is not None else UNITS.get(spec.name, "")
        self.unit = unit
        label = widgets.HTML(
            f"<span title='{html.escape(tooltip, quote=True)}' style='font-family:monospace;font-weight:600'>"
            f"{html.escape(spec.name.split('.')[-1])}</span>",
            layout=widgets.Layout(width=_LABEL_W),
        )
        self.note = widgets.HTML(self._note_html(""), layout=widgets.Layout(flex="1 1 auto", width="auto"))
        self.help = widgets.HTML(
            f"<div style='color:#57606a;font-size:0.8em;line-height:1.2;margin:-0.2em 0 0.1em {_LABEL_W}'>"
            f"{html.escape(spec.help)}</div>"
        )
        self.error = widgets.HTML("")
        parts = [label, *([self.toggle] if self.toggle is not None else []), self.input, self.note]
        row = widgets.HBox(parts, layout=widgets.Layout(align_items="center"))
        self.widget = widgets.VBox([row, self.help, self.error], layout=widgets.Layout(margin="0 0 0.15em 0"))
        self.widget.add_class("dsv4lab-field")
        self.widget.add_class("dsv4lab-field-" + spec.name.replace(".", "-"))
        if self.toggle is not None:
            self.toggle.observe(self._on_toggle, names="value")

    # -- values ------------------------------------------------------------------------------------------

    def _options(self, choices: Sequence[str]) -> list[tuple[str, Any]]:
        opts: list[tuple[str, Any]] = [(c, c) for c in choices]
        if self.spec.optional:
            opts.insert(0, (UNSET, UNSET))
        return opts

    def value(self) -> Any:
        """The value to hand to :meth:`ServerConfig.with_values`: a Python value, text the config parses by
        the field's type, or None for unset. Raises :class:`ConfigError` for text that cannot be meant."""
        if self.kind == "slider":
            if self.toggle is not None and not self.toggle.value:
                return None
            return self.input.value
        if self.kind == "text":
            text = str(self.input.value).strip()
            if not text:
                if self.spec.optional:
                    return None
                return [] if typing.get_origin(self.spec.type) is tuple else ""
            return text
        if self.kind == "env":
            env: dict[str, str] = {}
            for line in str(self.input.value).splitlines():
                if not line.strip():
                    continue
                key, sep, val = line.strip().partition("=")
                if not sep or not key.strip():
                    raise ConfigError(self.name, line.strip(), "NAME=value lines, one variable per line")
                env[key.strip()] = val
            return env
        if self.kind == "dropdown" and self.input.value == UNSET:
            return None
        return self.input.value

    def set_value(self, value: Any) -> None:
        """Show ``value`` (a config's value for this field; None = unset)."""
        if self.kind == "slider":
            if self.toggle is not None:
                self.toggle.value = value is not None
            if value is not None:
                if value > self.input.max:
                    self.input.max = value
                if value < self.input.min:
                    self.input.min = value
                self.input.value = value
            self._show_unset(value is None)
        elif self.kind == "checkbox":
            self.input.value = bool(value)
        elif self.kind == "dropdown":
            if value is not None and value not in (self.choices or ()):
                # Keep a value the preset has but the release lacks visible: check() then names it.
                self.input.options = [*self._options(self.choices or ()), (f"{value} (not in this release)", value)]
            self.input.value = UNSET if value is None and self.spec.optional else value
        elif self.kind == "env":
            items = dict(value or {})
            self.input.value = "\n".join(f"{k}={v}" for k, v in items.items())
        else:
            if value is None:
                self.input.value = ""
            elif isinstance(value, (list, tuple)):
                self.input.value = ",".join(str(v) for v in value)
            elif isinstance(value, bool):
                self.input.value = "true" if value else "false"
            else:
                self.input.value = str(value)

    def set_release(self, release: SGLangRelease) -> None:
        """Offer the choices of another SGLang release (the current value stays, flagged if refused)."""
        self.release = release
        if self.kind != "dropdown" or self.spec.name not in CHOICES_BY_RELEASE:
            return
        current = self.value()
        self.choices = _choices_for(self.spec, release)
        self.input.options = self._options(self.choices or ())
        self.set_value(current)

    def check(self) -> str | None:
        """What the chosen release would refuse, before the config's own validation runs."""
        value = self.value() if self.kind == "dropdown" else None
        if value is not None and value not in (self.choices or ()):
            allowed = ", ".join(self.choices or ())
            return f"a value SGLang {self.release.version} accepts: one of {allowed}"
        return None

    # -- display -----------------------------------------------------------------------------------------

    def show_error(self, message: str | None) -> None:
        """The message under the control, in red (None clears it)."""
        text = (
            ""
            if not message
            else "<div class='dsv4lab-error' style='color:#cf222e;font-size:0.85em;margin-left:"
            f"{_LABEL_W}'>✗ {html.escape(message)}</div>"
        )
        if self.error.value != text:
            self.error.value = text
        self.input.layout.border = "1px solid #cf222e" if message else ""

    def show_default(self, value: Any) -> None:
        """While unset, park the (disabled) slider at what SGLang would pick: ticking "set" starts there."""
        if self.kind == "slider" and self.value() is None and value is not None and value != self.input.value:
            if value > self.input.max:
                self.input.max = value
            self.input.value = value

    def show_note(self, note: str) -> None:
        """Beside the input: the unit, and what SGLang would pick when the field is unset."""
        text = self._note_html(note)
        if self.note.value != text:
            self.note.value = text

    def _note_html(self, note: str) -> str:
        parts = [p for p in (self.unit, note) if p]
        return f"<span style='color:#57606a;font-size:0.85em;margin-left:0.4em'>{html.escape(' · '.join(parts))}</span>"

    def observe(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (no arguments) whenever the user changes this field."""
        self.input.observe(lambda _change: callback(), names="value")
        if self.toggle is not None:
            self.toggle.observe(lambda _change: callback(), names="value")

    def _on_toggle(self, change: Mapping[str, Any]) -> None:
        self._show_unset(not change["new"])

    def _show_unset(self, unset: bool) -> None:
        """An unset slider is greyed and shows no number of its own: the note beside it says what SGLang
        picks, and a parked slider's readout beside that said the same number twice."""
        self.input.disabled = unset
        self.input.readout = not unset


def build_controls(release: SGLangRelease, cls: type = ServerConfig) -> dict[str, FieldControl]:
    """One :class:`FieldControl` per leaf field of ``cls`` (nested fields dotted), in declaration order."""
    return {spec.name: FieldControl(spec, release) for spec in field_specs(cls)}


def nested_prefixes(cls: type = ServerConfig) -> list[str]:
    """The names of the nested dataclass fields (``["speculative"]``): each gets its own block."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp, _ = _unwrap(hints[f.name])
        if dataclasses.is_dataclass(tp):
            out.append(f.name)
    return out
