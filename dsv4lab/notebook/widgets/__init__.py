"""Widgets for tweaking a server config in JupyterLab: :class:`ConfigPanel` and the parts it is made of.

=====================  ===============================================================================
``controls``           one control per config field, generated from the dataclass (type, bounds, help)
``preflight_view``     the verdict, the suggested fixes as buttons, the flags, the budget chart
``chartslot``          a chart redrawn off the kernel thread, the newest request winning
``logpane``            the live log, classified lines highlighted
``actions``            the worker thread for long actions, the state badge, the results pane, the monitor
``server_actions``     Launch / Stop / Bench / Diagnose / Save / launch script / Open as experiment
``experiment``         the panel's state as an experiment notebook's parameters
``panel``              :class:`ConfigPanel`, which puts them together
=====================  ===============================================================================

Import it where widgets are wanted (``from dsv4lab.notebook.widgets import ConfigPanel``); ``import dsv4lab`` does
not load ipywidgets.
"""

from __future__ import annotations

from dsv4lab.notebook.widgets.controls import FieldControl, build_controls, field_specs
from dsv4lab.notebook.widgets.panel import ConfigPanel

__all__ = ["ConfigPanel", "FieldControl", "build_controls", "field_specs"]
