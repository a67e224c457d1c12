"""Executed notebooks as self-contained HTML reports that open offline, years later.

nbconvert's ``lab`` template loads require.js, MathJax and mermaid from a CDN, and saved widget state
pulls a widget manager from another: offline, the page waits on requests that never answer. The
``dsv4lab_report`` template (package data) drops those scripts, folds each cell's code under a "code"
toggle (hidden entirely for cells tagged ``hide-input``: the narrative cells), and opens with a
provenance header and a status line that links to the failing cell. Charts reach it as inline SVG (the
offline Altair renderer emits one beside the Vega-Lite spec), so nothing on the page needs the network.

A report is shared, so it is also made safe to share: secret values are redacted (:mod:`dsv4lab.secrets`),
paths under the user's home outside the run dir are shown as ``~/...``, and the page carries no executable
script at all — a server log line ``<script>`` stays text (outputs escape it), and HTML an output or a
Markdown cell brought in loses its ``<script>``/``<iframe>`` elements, ``on*`` handlers and
``javascript:`` URLs (:func:`defang_html`). The file is private to the user (0600).
"""

from __future__ import annotations

import copy
import html
import json
import os
import re
from collections.abc import Iterable, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import nbformat
from nbconvert import HTMLExporter

from dsv4lab.atomicfile import write_text_atomic
from dsv4lab.resources import TEMPLATES
from dsv4lab.secrets import collect_secrets, redact_data

__all__ = [
    "MAX_REPORT_BYTES",
    "TEMPLATE_DIR",
    "defang_html",
    "public_html",
    "redact_notebook_file",
    "render_report",
    "scrub_home",
]

#: Where nbconvert finds the report template (the package's own templates).
TEMPLATE_DIR = TEMPLATES
TEMPLATE = "dsv4lab_report"

#: A report should stay under this (the issue's bound); bigger ones get a warning in their header.
MAX_REPORT_BYTES = 2 * 1024 * 1024

#: Output types the report cannot show without a widget manager or a remote script: dropped.
_DROP_MIMETYPES = (
    "application/vnd.jupyter.widget-view+json",
    "application/vnd.jupyter.widget-state+json",
    "application/javascript",  # nbconvert would put it in a <script>: a report runs no code
)


def render_report(
    notebook: str | Path | nbformat.NotebookNode,
    out_html: Path,
    *,
    title: str,
    provenance: Sequence[tuple[str, str]] = (),
    ok: bool = True,
    secrets: Iterable[str] = (),
    keep_paths: Sequence[str | Path] = (),
) -> Path:
    """Write ``notebook`` (an executed notebook or its path) as one offline HTML page; returns its path.

    ``secrets`` are values to mask besides those :mod:`dsv4lab.secrets` finds by name, shape and in this
    process's environment; paths under ``keep_paths`` (default: the report's folder) stay absolute, other
    paths under the home directory are shown as ``~/...``.
    """
    if isinstance(notebook, nbformat.NotebookNode):
        nb = notebook
    else:
        nb = nbformat.read(str(notebook), as_version=4)  # type: ignore[no-untyped-call]
    known = collect_secrets(environ=None) | frozenset(secrets)
    keep = [str(p) for p in keep_paths] or [str(out_html.parent.resolve())]
    nb = nbformat.from_dict(_public(dict(_clean(copy.deepcopy(nb))), known, keep))  # type: ignore[no-untyped-call]
    provenance = [(k, scrub_home(str(redact_data(v, known)), keep)) for k, v in provenance]
    title = scrub_home(str(redact_data(title, known)), keep)
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
    body = defang_html(body)
    return write_text_atomic(out_html, body)


def public_html(markup: str, keep_paths: Sequence[str | Path] = ()) -> str:
    """An index page made safe to share like a report: secrets masked, home paths outside ``keep_paths``
    written ``~/...``, nothing executable (the campaign and sweep indexes go through this)."""
    text = redact_data(markup, collect_secrets())
    return defang_html(scrub_home(str(text), [str(p) for p in keep_paths]))


def redact_notebook_file(path: str | Path, secrets: Iterable[str] = ()) -> None:
    """Rewrite an executed notebook with its secret values masked (parameters, sources, outputs, metadata),
    whole or not at all, private to the user. Run on ``notebook.ipynb`` once papermill is done with it."""
    target = Path(path)
    try:
        data = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # nothing readable to redact; the runner reports a missing notebook on its own
    known = collect_secrets(environ=None) | frozenset(secrets)
    text = json.dumps(redact_data(data, known, skip_keys=_BINARY_KEYS), indent=1, ensure_ascii=False) + "\n"
    write_text_atomic(target, text)


#: Output data that is base64 (nothing to redact or scrub, and large).
_BINARY_KEYS = ("image/png", "image/jpeg", "image/gif", "image/webp")


def _public(data: Any, known: frozenset[str], keep: Sequence[str]) -> Any:
    """Notebook data with secrets masked and home paths outside ``keep`` shown as ``~/...``."""
    return _scrub_all(redact_data(data, known, skip_keys=_BINARY_KEYS), keep)


def _scrub_all(obj: Any, keep: Sequence[str]) -> Any:
    if isinstance(obj, str):
        return scrub_home(obj, keep)
    if isinstance(obj, dict):
        return {k: v if k in _BINARY_KEYS else _scrub_all(v, keep) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_scrub_all(v, keep) for v in obj]
    return obj


def scrub_home(text: str, keep: Sequence[str] = (), home: str | None = None) -> str:
    """``text`` with absolute paths under the home directory written ``~/...``, except those inside
    ``keep`` (the run dir: a report may say where its own files are). A report is shared; the user's
    name and the layout of their home are not part of the result."""
    home = (home if home is not None else os.path.expanduser("~")).rstrip("/")
    if not home or home == "/" or home not in text:
        return text
    roots = [k.rstrip("/") for k in keep if k.rstrip("/")]

    def swap(m: re.Match[str]) -> str:
        for root in roots:
            end = m.start() + len(root)
            if text.startswith(root, m.start()) and (end == len(text) or not _is_path_char(text[end])):
                return m.group(0)
        return "~"

    return re.sub(re.escape(home) + r"(?![\w.-])", swap, text)


def _is_path_char(ch: str) -> bool:
    return ch.isalnum() or ch in "._-"


# -- no script in a report -------------------------------------------------------------------------------------

#: Elements whose content runs or loads something: dropped with everything inside them.
_DROP_ELEMENTS = frozenset({"script", "iframe", "object", "embed", "applet", "frame", "frameset", "base"})
_URL_ATTRS = frozenset({"href", "src", "action", "formaction", "xlink:href", "data", "poster", "background"})
_VOID = frozenset({"area", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"})


class _Defang(HTMLParser):
    """Re-emits HTML as it came, minus executable parts. Untouched tags keep their original text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.out: list[str] = []
        self._skip: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag(tag, attrs, self.get_starttag_text() or "", closed=False)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._tag(tag, attrs, self.get_starttag_text() or "", closed=True)

    def _tag(self, tag: str, attrs: list[tuple[str, str | None]], text: str, *, closed: bool) -> None:
        if self._skip:
            if tag == self._skip[-1] and not closed and tag not in _VOID:
                self._skip.append(tag)
            return
        if tag in _DROP_ELEMENTS:
            if not closed and tag not in _VOID and tag != "base":
                self._skip.append(tag)
            return
        if tag == "meta" and any(k == "http-equiv" and (v or "").lower() == "refresh" for k, v in attrs):
            return
        kept = [(k, v) for k, v in attrs if not _unsafe_attr(k, v)]
        if len(kept) == len(attrs):
            self.out.append(text)
            return
        rendered = "".join(f" {k}" if v is None else f' {k}="{html.escape(v, quote=True)}"' for k, v in kept)
        self.out.append(f"<{tag}{rendered}{' /' if closed else ''}>")

    def handle_endtag(self, tag: str) -> None:
        if self._skip:
            if tag == self._skip[-1]:
                self._skip.pop()
            return
        if tag in _DROP_ELEMENTS:
            return
        self.out.append(f"</{tag}>")

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.out.append(data)

    def handle_entityref(self, name: str) -> None:
        if not self._skip:
            self.out.append(f"&{name};")

    def handle_charref(self, name: str) -> None:
        if not self._skip:
            self.out.append(f"&#{name};")

    def handle_comment(self, data: str) -> None:
        if not self._skip:
            self.out.append(f"<!--{data}-->")

    def handle_decl(self, decl: str) -> None:
        self.out.append(f"<!{decl}>")

    def handle_pi(self, data: str) -> None:
        pass  # processing instructions mean nothing in HTML

    def unknown_decl(self, data: str) -> None:
        if not self._skip:
            self.out.append(f"<![{data}]>")


def _unsafe_attr(name: str, value: str | None) -> bool:
    if name.startswith("on") or name == "srcdoc":
        return True
    if name in _URL_ATTRS and value is not None:
        squashed = re.sub(r"[\s\x00-\x1f]+", "", html.unescape(value)).lower()
        if squashed.startswith(("javascript:", "vbscript:")) or (
            squashed.startswith("data:") and not squashed.startswith("data:image/")
        ):
            return True
    return False


def defang_html(markup: str) -> str:
    """``markup`` without anything that could run: script-like elements (with their content), ``on*``
    handlers, ``srcdoc``, ``javascript:``/``vbscript:`` and non-image ``data:`` URLs, refresh redirects.
    Everything else is kept byte for byte, so a report looks the same; it never needed a script anyway."""
    parser = _Defang()
    parser.feed(markup)
    parser.close()
    return "".join(parser.out)


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
                _name_chart(output, data)
                for mimetype in _DROP_MIMETYPES:
                    data.pop(mimetype, None)
                if not data and output.get("output_type") in ("display_data", "execute_result"):
                    continue
            kept.append(output)
        cell["outputs"] = kept
    return nb


def _name_chart(output: Any, data: dict[str, Any]) -> None:
    """Give a chart's image the alt text of its title when its display carried none (a notebook executed
    before charts said what they show, or a chart displayed some other way): read from its Vega-Lite spec."""
    spec = next((v for k, v in data.items() if k.startswith("application/vnd.vegalite.")), None)
    if not isinstance(spec, dict) or not ({"image/svg+xml", "image/png"} & set(data)):
        return
    metadata = output.setdefault("metadata", {})
    if all(isinstance(metadata.get(m), dict) and metadata[m].get("alt") for m in ("image/svg+xml", "image/png")):
        return
    from dsv4lab.plots.export import alt_text  # Altair only for notebooks that have charts

    words = alt_text(spec)
    for mimetype in ("image/svg+xml", "image/png"):
        entry = metadata.setdefault(mimetype, {})
        if isinstance(entry, dict):
            entry.setdefault("alt", words)
