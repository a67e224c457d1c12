"""Executed notebooks as self-contained HTML reports that open offline, years later.

nbconvert's ``lab`` template loads require.js, MathJax and mermaid from a CDN, and saved widget state
pulls a widget manager from another: offline, the page waits on requests that never answer. The
``dsv4lab_report`` template (package data) drops those scripts, folds each cell's code under a "code"
toggle (hidden entirely for cells tagged ``hide-input``: the narrative cells), and opens with a
provenance header and a status line that links to the failing cell. Charts reach it as inline SVG (the
offline Altair renderer emits one beside the Vega-Lite spec), so nothing on the page needs the network.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import nbformat
from nbconvert import HTMLExporter

__all__ = ["MAX_REPORT_BYTES", "TEMPLATE_DIR", "render_report"]

TEMPLATE_DIR = Path(__file__).parent / "templates"
TEMPLATE = "dsv4lab_report"

#: A report should stay under this (the issue's bound); bigger ones get a warning in their header.
MAX_REPORT_BYTES = 2 * 1024 * 1024

#: Output types the report cannot show without a widget manager or a remote script: dropped.
_DROP_MIMETYPES = ("application/vnd.jupyter.widget-view+json", "application/vnd.jupyter.widget-state+json")


def render_report(
    notebook: str | Path | nbformat.NotebookNode,
    out_html: Path,
    *,
    title: str,
    provenance: Sequence[tuple[str, str]] = (),
    ok: bool = True,
) -> Path:
    """Write ``notebook`` (an executed notebook or its path) as one offline HTML page; returns its path."""
    if isinstance(notebook, nbformat.NotebookNode):
        nb = notebook
    else:
        nb = nbformat.read(str(notebook), as_version=4)  # type: ignore[no-untyped-call]
    nb = _clean(copy.deepcopy(nb))
    exporter = HTMLExporter(  # type: ignore[no-untyped-call]
        template_name=TEMPLATE,
        extra_template_basedirs=[str(TEMPLATE_DIR)],
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    resources: dict[str, Any] = {"dsv4lab": {"title": title, "provenance": list(provenance), "ok": ok}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    if len(body.encode()) > MAX_REPORT_BYTES:
        note = ("size", f"{len(body.encode()) / 1e6:.1f} MB: more than the 2 MB a report should stay under")
        resources["dsv4lab"]["provenance"].append(note)
        body, _ = exporter.from_notebook_node(nb, resources=resources)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_html.with_name(out_html.name + ".tmp")
    tmp.write_text(body, encoding="utf-8")
    tmp.replace(out_html)
    return out_html


def _clean(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop what would need a remote script: widget state and widget views; keep everything else."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            data = output.get("data")
            if isinstance(data, dict):
                for mimetype in _DROP_MIMETYPES:
                    data.pop(mimetype, None)
                if not data and output.get("output_type") in ("display_data", "execute_result"):
                    continue
            kept.append(output)
        cell["outputs"] = kept
    return nb
