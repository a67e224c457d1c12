"""The page reader that holds reports to the clock-and-unit rule finds what breaks it (and nothing else)."""

from __future__ import annotations

from tests.figures import problems, read_page

CLEAN = """
<p>READY after 141 s (modelled). Config A decodes 20.2 tok/s at concurrency 16.</p>
<table><thead><tr><th>concurrency</th><th>output tok/s</th><th>output tok/s (twin clock)</th><th>TTFT median (ms)</th>
<th>status</th></tr></thead>
<tbody><tr><td>16</td><td>20.2</td><td>1,011.1</td><td>18,214.9</td><td>ok</td></tr></tbody></table>
<svg><g class="mark-text role-axis-title"><text>time since the server's first log line (s, modelled hardware)</text></g>
<g class="mark-text role-axis-title"><text>GPU memory used (GiB)</text></g></svg>
"""


def test_a_page_that_reads_right_has_no_problems() -> None:
    page = read_page(CLEAN, "clean")
    assert [t.headers[:2] for t in page.tables] == [["concurrency", "output tok/s"]]
    assert "GPU memory used (GiB)" in page.axis_titles
    assert problems(page, twin=True, max_tok_s=3379.0, twin_values=frozenset({"1,011.1"})) == []


def test_each_kind_of_mislabelled_figure_is_found() -> None:
    bad = """
    <p>READY after 2.9 s. best 1,034.2 output tok/s</p>
    <table><thead><tr><th>label</th><th>TTFT median</th><th>output tok/s</th></tr></thead>
    <tbody><tr><td>a</td><td>38.1</td><td>1,011.1</td></tr><tr><td>b</td><td>40.2</td><td>4,200.0</td></tr></tbody></table>
    <svg><g class="mark-text role-axis-title"><text>time since sampling started (s)</text></g>
    <g class="mark-text role-axis-title"><text>Memory use</text></g></svg>
    """
    found = problems(read_page(bad, "bad"), twin=True, max_tok_s=3379.0, twin_values=frozenset({"1,011.1"}))
    text = "\n".join(found)
    assert "'TTFT median' holds numbers without a unit" in text
    assert "twin-clock value 1,011.1 is shown outside a 'twin clock' column" in text
    assert "'output tok/s' = 4,200.0 is above the hardware's roofline" in text
    assert "time axis 'time since sampling started (s)' is not on the modelled hardware's clock" in text
    assert "chart axis 'Memory use' has no unit" in text
    assert "'READY after 2.9 s' does not say it is the modelled hardware's time" in text
    # A real server's page is read as measured: its time axes need no "modelled".
    real = problems(read_page(bad, "real"), twin=False)
    assert not any("modelled" in p for p in real) and any("no unit" in p for p in real)
