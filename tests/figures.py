"""What a page says, read back: every table, chart axis and sentence checked for its unit and its clock.

The rule (``dsv4lab.units``): on the twin every figure a person reads is on the modelled hardware, labelled
once per page; a twin-clock value sits only in a column or key whose name says "twin clock"; every number
has its unit. This module reads a rendered page (a report, an index, a panel's output) the way a reader
does — tables cell by cell, the axis titles inside its SVG charts (inline or as data URIs), its sentences —
and lists what breaks the rule, so a test can assert the list is empty and print it when it is not.
"""

from __future__ import annotations

import base64
import html as _html
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

__all__ = ["Page", "problems", "read_page"]

#: A header that names one of these is labelled with its unit.
UNIT_WORDS = (
    "tok/s",
    "req/s",
    "(ms",
    "(s",
    "(gib",
    "gib)",
    "(%)",
    "(tokens",
    "tokens)",
    "(requests",
    "requests)",
    "(min",
    "(h",
)
#: Headers of plain counts or ordinals, which need no unit.
COUNT_HEADERS = {
    "gpu",
    "concurrency",
    "repeat",
    "repeats",
    "requests ok",
    "samples",
    "lookups",
    "tokens per request",
    "accepted tokens per step",
    "port",
    "runs",
    "n",
    "launcher_pid",
    "step",
    "pid",
    "rank",
    "node rank",
    "exit status",
    "mem_fraction_static",
    "cuda_graph_max_bs",
    "max_running_requests",
    "chunked_prefill_size",
    "tp",
}
_NUMBER = re.compile(r"^[-+]?\d[\d,]*(\.\d+)?$")
_TOK_S = re.compile(r"(?<![\w.])(\d[\d,]*(?:\.\d+)?)\s*tok/s")
_TIME_AXIS = re.compile(r"\btime since\b|\((s|min|h|ms)[,)]")
_READY = re.compile(r"\b(READY|CRASHED|STALLED|TIMEOUT) after [\d,.]+ s(?! \(modelled\))")


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]


@dataclass
class Page:
    name: str
    tables: list[Table] = field(default_factory=list)
    axis_titles: list[str] = field(default_factory=list)
    text: str = ""


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[Table] = []
        self._stack: list[Table] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._head = False
        self._skip = 0
        self.text: list[str] = []
        self.svgs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("style", "script"):
            self._skip += 1
        if tag == "img":
            src = dict(attrs).get("src") or ""
            if src.startswith("data:image/svg+xml;base64,"):
                self.svgs.append(base64.b64decode(src.split(",", 1)[1]).decode("utf-8", "replace"))
        if tag == "table":
            self._stack.append(Table([], []))
        elif tag == "tr" and self._stack:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
            self._head = tag == "th"
        if tag in ("p", "div", "br", "li", "tr", "h1", "h2", "h3"):
            self.text.append("\n")
        elif tag in ("td", "th", "span", "b"):
            self.text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script"):
            self._skip = max(0, self._skip - 1)
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._stack:
            table = self._stack[-1]
            if self._head and not table.headers and not table.rows:
                table.headers = self._row
            else:
                table.rows.append(self._row)
            self._row = None
        elif tag == "table" and self._stack:
            self.tables.append(self._stack.pop())

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        if self._cell is not None:
            self._cell.append(data)
        self.text.append(data)


def _svg_axis_titles(svg: str) -> list[str]:
    titles = []
    for m in re.finditer(r'class="mark-text role-axis-title".*?</g>', svg, re.S):
        words = re.findall(r"<text[^>]*>(.*?)</text>", m.group(0), re.S)
        inner = " ".join(re.sub(r"<[^>]+>", " ", w) for w in words)
        titles.append(" ".join(_html.unescape(inner).split()))
    return [t for t in titles if t]


def read_page(markup: str, name: str = "") -> Page:
    """A page's tables, chart axis titles (inline SVG and SVG data URIs) and visible text."""
    reader = _Reader()
    reader.feed(markup)
    svgs = [*reader.svgs, *re.findall(r"<svg.*?</svg>", markup, re.S)]
    titles = [t for svg in svgs for t in _svg_axis_titles(svg)]
    return Page(name, reader.tables, titles, "".join(reader.text))


def _numeric(cells: list[str]) -> bool:
    values = [c for c in cells if c and c not in ("–", "-", "—")]
    return bool(values) and sum(1 for c in values if _NUMBER.match(c)) >= 0.6 * len(values)


def _labelled(header: str) -> bool:
    h = header.lower()
    return h in COUNT_HEADERS or any(w in h for w in UNIT_WORDS)


def problems(
    page: Page, *, twin: bool, max_tok_s: float | None = None, twin_values: frozenset[str] = frozenset()
) -> list[str]:
    """Everything on ``page`` that breaks the clock-and-unit rule, one line each (empty: the page reads right).

    ``twin``: the page is a twin's (its times must be on the modelled hardware, and say so); ``max_tok_s``:
    no throughput a page states may exceed it (the hardware's memory-bandwidth roofline: a twin-clock figure
    is many times the hardware's); ``twin_values``: figures as the twin measured them, formatted as a page
    would print them, which may appear only under a "twin clock" header.
    """
    out: list[str] = []
    where = page.name
    allowed: dict[str, int] = {}  # twin-clock values shown where they belong, under a "twin clock" header
    for t in page.tables:
        for i, header in enumerate(t.headers):
            if "twin clock" in header.lower():
                for r in t.rows:
                    if i < len(r):
                        allowed[r[i]] = allowed.get(r[i], 0) + 1
    for value in sorted(twin_values):
        seen = len(re.findall(rf"(?<![\d.,]){re.escape(value)}(?![\d])", page.text))
        if seen > allowed.get(value, 0):
            i = page.text.find(value)
            context = " ".join(page.text[max(0, i - 80) : i + 40].split())
            out.append(f"{where}: the twin-clock value {value} is shown outside a 'twin clock' column: {context!r}")
    for t in page.tables:
        if not t.headers:
            continue
        for i, header in enumerate(t.headers):
            cells = [r[i] for r in t.rows if i < len(r)]
            if _numeric(cells) and not _labelled(header):
                out.append(f"{where}: table column {header!r} holds numbers without a unit ({cells[:3]})")
            twin_column = "twin clock" in header.lower()
            for c in cells:
                if twin_column or max_tok_s is None or "tok/s" not in header or not _NUMBER.match(c):
                    continue
                if "bound" not in header.lower() and float(c.replace(",", "")) > max_tok_s:
                    out.append(f"{where}: {header!r} = {c} is above the hardware's roofline ({max_tok_s:,.0f} tok/s)")
    for title in page.axis_titles:
        # A parameter's name on a categorical axis (a sweep's cuda_graph_max_bs) is its own label.
        named = re.search(r"\(.+\)", title) or _labelled(title) or re.fullmatch(r"[a-z][a-z0-9_.]*", title)
        if not named:
            out.append(f"{where}: chart axis {title!r} has no unit")
        if twin and _TIME_AXIS.search(title) and "modelled hardware" not in title:
            out.append(f"{where}: time axis {title!r} is not on the modelled hardware's clock")
    text = page.text
    if twin:
        for m in _READY.finditer(text):
            out.append(f"{where}: {m.group(0)!r} does not say it is the modelled hardware's time")
    if max_tok_s is not None:
        for m in _TOK_S.finditer(text):
            tok_s = float(m.group(1).replace(",", ""))
            context = text[max(0, m.start() - 60) : m.end() + 20]
            if tok_s > max_tok_s and "twin clock" not in context and "goal" not in context:
                out.append(f"{where}: {m.group(0)!r} is above the hardware's roofline ({context.strip()!r})")
    return out
