"""Charts in a report say what they show: each image's alt text (and an inline SVG's label) is the chart's
title and subtitle, never nbconvert's "No description has been provided for this image"."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import altair as alt
import nbformat
import pandas as pd
import pytest

from dsv4lab import plots
from dsv4lab.notebook.nbrun import run_notebook
from dsv4lab.notebook.report import render_report
from tests.test_faults_support import write_notebook

NBCONVERT_DEFAULT = "No description has been provided for this image"


class _Images(HTMLParser):
    """Every <img> and <svg> start tag of a page, with its attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("img", "svg"):
            self.tags.append((tag, dict(attrs)))


def _images(markup: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = _Images()
    parser.feed(markup)
    return parser.tags


def _frame() -> pd.DataFrame:
    frame: pd.DataFrame = pd.DataFrame({"concurrency": [1, 16], "tok_s": [12.5, 20.0]})
    return frame


def test_alt_text_is_the_title_and_subtitle() -> None:
    bars = alt.Chart(_frame()).mark_bar().encode(x="concurrency:O", y="tok_s:Q")
    assert plots.alt_text(bars.properties(title="Throughput")) == "Throughput"
    titled = bars.properties(title=alt.TitleParams("Throughput", subtitle=["modelled hardware", "95 % CI"]))
    assert plots.alt_text(titled) == "Throughput — modelled hardware 95 % CI"
    parts = alt.hconcat(bars.properties(title="TTFT"), bars.properties(title="ITL"))
    assert plots.alt_text(parts) == "TTFT; ITL"  # a compound chart without its own title: its parts' titles
    assert plots.alt_text(bars) == "A chart without a title"


def test_an_svg_names_itself_for_inline_use() -> None:
    chart = alt.Chart(_frame()).mark_bar().encode(x="concurrency:O", y="tok_s:Q").properties(title="A <b> & c")
    svg = plots.to_svg(chart)
    tag, attrs = _images(svg)[0]
    assert tag == "svg" and attrs["role"] == "img" and attrs["aria-label"] == "A <b> & c"
    assert "<title>A &lt;b&gt; &amp; c</title>" in svg


@pytest.mark.slow
def test_every_chart_in_a_report_carries_its_title_as_alt_text(tmp_path: Path) -> None:
    # The two ways the notebooks show a chart: ex.chart() (kept as a file for the index too) and a chart
    # as the cell's value through the offline renderer; and a chart whose parts carry the titles.
    chart = (
        "import altair as alt, pandas as pd\n"
        "from dsv4lab.notebook.experiment import Experiment\n"
        "ex = Experiment.from_namespace(globals())\n"
        "df = pd.DataFrame({'c': [1, 16], 'v': [12.5, 20.0]})\n"
        "bars = alt.Chart(df).mark_bar().encode(x='c:O', y='v:Q')"
    )
    notebook = write_notebook(
        tmp_path / "charts.ipynb",
        "x: int = 1  # unused",
        [
            chart,
            "ex.chart(bars.properties(title=alt.TitleParams('Kept chart', subtitle='modelled hardware')), 'kept')",
            "bars.properties(title='Shown chart')",
            "alt.hconcat(bars.properties(title='Left part'), bars.properties(title='Right part'))",
        ],
        title="Charts",
    )
    run = run_notebook(notebook, {}, reports_root=tmp_path / "reports")
    markup = run.report.read_text()
    assert NBCONVERT_DEFAULT not in markup
    alts = [attrs.get("alt") for tag, attrs in _images(markup) if tag == "img"]
    assert alts == ["Kept chart — modelled hardware", "Shown chart", "Left part; Right part"], alts
    # The kept file names itself too (the campaign index embeds it).
    kept = (run.run_dir / "charts" / "kept.svg").read_text()
    assert _images(kept)[0][1]["aria-label"] == "Kept chart — modelled hardware"
    # A notebook executed before charts carried their alt text renders with it too (from the chart's spec).
    executed = nbformat.read(str(run.executed), as_version=4)  # type: ignore[no-untyped-call]
    for cell in executed.cells:
        for output in cell.get("outputs", []):
            output.pop("metadata", None)
    again = render_report(executed, tmp_path / "again.html", title="Charts")
    assert [a.get("alt") for t, a in _images(again.read_text()) if t == "img"] == alts
