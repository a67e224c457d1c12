"""A/B verdicts on synthetic runs with known means and variances, including the exact boundary."""

from __future__ import annotations

import dataclasses
import math

import pytest

from dsv4lab.bench import BenchError, BenchResult, compare, summarize, t_quantile, verdict_for, welch
from dsv4lab.bench.ab import ab_schedule
from dsv4lab.bench.metrics import Distribution
from dsv4lab.bench.results import Provenance, records_frame
from dsv4lab.bench.stats import t_cdf


def run(concurrency: int, tput: float, *, ttft_median: float = 100.0, partial: bool = False) -> BenchResult:
    s = dataclasses.replace(
        summarize([], 1.0),
        output_throughput=tput,
        ttft_ms=dataclasses.replace(Distribution.of([1.0]), median=ttft_median),
    )
    prov = Provenance(url="http://127.0.0.1:1", backend="dsv4lab", api="completions")
    return BenchResult(s, records_frame([]), prov, concurrency, partial=partial)


def runs(concurrency: int, values: list[float]) -> list[BenchResult]:
    return [run(concurrency, v) for v in values]


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706204736),
        (0.975, 2, 4.302652730),
        (0.975, 3, 3.182446305),
        (0.975, 4, 2.776445105),
        (0.975, 10, 2.228138852),
        (0.975, 30, 2.042272456),
        (0.995, 5, 4.032142984),
        (0.95, 8, 1.859548038),
        (0.975, math.inf, 1.959963985),
    ],
)
def test_t_quantile_matches_tables(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=1e-8)
    assert t_quantile(1 - p, df) == pytest.approx(-expected, abs=1e-8)


def test_t_quantile_inverts_the_cdf_for_fractional_df() -> None:
    for df in (2.3, 4.71, 17.5, 123.4):
        for p in (0.6, 0.9, 0.975, 0.999):
            assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-12)
    with pytest.raises(BenchError):
        t_quantile(1.0, 3)


def test_story_shape_better_at_1_no_difference_at_16() -> None:
    a = runs(1, [10.0, 10.3, 9.8, 10.1]) + runs(16, [23.0, 24.1, 22.6])
    b = runs(1, [14.9, 14.6, 15.2]) + runs(16, [23.5, 22.3, 24.0])
    cmp = compare(a, b)
    assert [lv.concurrency for lv in cmp.levels] == [1, 16]
    one, sixteen = cmp.at(1), cmp.at(16)
    assert one.verdict == "better"
    assert one.rel_diff == pytest.approx(14.9 / 10.05 - 1, abs=0.01)
    assert one.ci_low > 0
    assert sixteen.verdict == "no detectable difference"
    assert sixteen.ci_low < 0 < sixteen.ci_high
    assert "better" in str(cmp) and "<table" in cmp._repr_html_()
    assert list(cmp.to_frame()["verdict"]) == ["better", "no detectable difference"]


def test_worse_and_lower_is_better_metrics() -> None:
    assert compare(runs(4, [10, 11, 10.5]), runs(4, [7, 7.2, 6.9])).at(4).verdict == "worse"
    a = [run(4, 1, ttft_median=v) for v in (200, 210, 205)]
    b = [run(4, 1, ttft_median=v) for v in (150, 149, 152)]
    cmp = compare(a, b, metric="ttft_ms.median")
    assert not cmp.higher_is_better and cmp.at(4).verdict == "better"  # lower TTFT is better


def test_welch_by_hand() -> None:
    # a: mean 0, s^2 = 1, n = 3; b: mean 3, s^2 = 4, n = 3 -> se = sqrt(1/3 + 4/3); df = (5/3)^2 / ((1/9 + 16/9) / 2)
    w = welch([-1, 0, 1], [1, 3, 5])
    assert w.diff == pytest.approx(3.0)
    assert w.se == pytest.approx(math.sqrt(5 / 3))
    assert w.df == pytest.approx((5 / 3) ** 2 / ((1 / 9 + 16 / 9) / 2))
    assert w.ci_low == pytest.approx(3.0 - t_quantile(0.975, w.df) * math.sqrt(5 / 3))


def test_exact_boundary() -> None:
    # a: mean 0, variance 1; b: same spread shifted by d. se = sqrt(2/3), df = 4 exactly.
    se = math.sqrt(2 / 3)
    t = t_quantile(0.975, 4)
    just_in = t * se * (1 + 1e-9)
    just_out = t * se * (1 - 1e-9)
    a = [-1.0, 0.0, 1.0]
    assert welch(a, [just_in - 1, just_in, just_in + 1]).df == pytest.approx(4.0)
    assert compare(runs(1, a), runs(1, [just_in - 1, just_in, just_in + 1])).at(1).verdict == "better"
    assert compare(runs(1, a), runs(1, [just_out - 1, just_out, just_out + 1])).at(1).verdict == (
        "no detectable difference"
    )
    # An interval that touches zero exactly is not a difference, on either side.
    assert verdict_for(0.0, 5.0, higher_is_better=True) == "no detectable difference"
    assert verdict_for(-5.0, 0.0, higher_is_better=True) == "no detectable difference"
    assert verdict_for(5e-324, 5.0, higher_is_better=True) == "better"
    assert verdict_for(-5.0, -5e-324, higher_is_better=False) == "better"


def test_zero_variance_arms() -> None:
    assert compare(runs(2, [5, 5, 5]), runs(2, [5, 5, 5])).at(2).verdict == "no detectable difference"
    lv = compare(runs(2, [5, 5, 5]), runs(2, [6, 6, 6])).at(2)
    assert lv.verdict == "better" and lv.ci_low == lv.ci_high == 1.0


def test_requires_three_repeats_and_common_levels_and_skips_partial_runs() -> None:
    with pytest.raises(BenchError, match="at least 3"):
        compare(runs(1, [1, 2]), runs(1, [1, 2, 3]))
    with pytest.raises(BenchError, match="no concurrency level in common"):
        compare(runs(1, [1, 2, 3]), runs(2, [1, 2, 3]))
    b = [*runs(1, [2, 2.1, 2.2]), run(1, 0.0, partial=True)]
    lv = compare(runs(1, [1, 1.1, 1.2]), b).at(1)
    assert lv.n_b == 3 and lv.verdict == "better"
    with pytest.raises(BenchError, match="unknown metric"):
        compare(runs(1, [1, 2, 3]), runs(1, [1, 2, 3]), metric="nope")


def test_ab_schedule_interleaves() -> None:
    assert ab_schedule([1, 16], 2) == [
        ("A", 1, 0),
        ("B", 1, 0),
        ("A", 1, 1),
        ("B", 1, 1),
        ("A", 16, 0),
        ("B", 16, 0),
        ("A", 16, 1),
        ("B", 16, 1),
    ]
    assert [arm for arm, _, _ in ab_schedule([1], 2, interleave=False)] == ["A", "A", "B", "B"]
