"""The tuner's parts that start nothing: the space, the SLOs, the objective, the model's order, the frontier."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pytest

from dsv4lab.bench.slo import parse_slo
from dsv4lab.config.presets import preset
from dsv4lab.config.server_config import field_names
from dsv4lab.errors import ConfigError
from dsv4lab.model.memory import preflight
from dsv4lab.notebook.tune import Objective, grid, model_order, parse_space
from dsv4lab.plots import to_svg
from dsv4lab.plots.frontier import frontier_chart, pareto_front
from dsv4lab.units import Clock

FIELDS = list(field_names())


def test_a_range_is_cut_in_five_steps_or_by_its_step_and_choices_keep_their_order() -> None:
    dims = parse_space(
        ["mem_fraction_static=0.50:0.75", "cuda_graph_max_bs=64,8,16", "chunked_prefill_size=2048:8192:2048"], FIELDS
    )
    assert [d.values for d in dims] == [
        (0.5, 0.55, 0.6, 0.65, 0.7, 0.75),
        (64, 8, 16),
        (2048, 4096, 6144, 8192),
    ]
    assert all(d.ordered for d in dims)
    assert len(grid(dims)) == 6 * 3 * 4
    assert grid(dims)[0] == {"mem_fraction_static": 0.5, "cuda_graph_max_bs": 64, "chunked_prefill_size": 2048}
    same = parse_space({"mem_fraction_static": "0.50:0.75", "cuda_graph_max_bs": [64, 8, 16]}, FIELDS)
    assert [d.values for d in same] == [d.values for d in dims[:2]]


@pytest.mark.parametrize(
    ("space", "field", "allowed"),
    [
        (["nope=1,2"], "unknown config field 'nope'", "mem_fraction_static"),
        (["mem_fraction_static=0.5"], "space mem_fraction_static", "at least two different values"),
        (["mem_fraction_static=0.75:0.5"], "space mem_fraction_static", "lo < hi"),
        (["mem_fraction_static=a:b"], "space mem_fraction_static", "lo:hi or lo:hi:step"),
        (["cuda_graph_max_bs"], "space", "FIELD=lo:hi[:step]"),
        (["tp=8,4", "tp=2,1"], "space tp", "one range or list per field"),
        ([], "space", "at least one FIELD"),
    ],
)
def test_a_bad_space_names_what_and_what_is_allowed(space: list[str], field: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_space(space, FIELDS)
    assert field in str(err.value) and allowed in str(err.value), str(err.value)


def test_slos_parse_from_the_cli_a_mapping_or_text() -> None:
    (limit,) = parse_slo(["tpot_p99_ms=400"])
    assert (limit.latency, limit.statistic, limit.limit_ms, limit.name) == ("tpot", "p99", 400.0, "tpot_p99_ms")
    assert str(limit) == "TPOT p99 ≤ 400 ms"
    assert [s.name for s in parse_slo({"ttft_p90_ms": 2000, "itl_median_ms": 50})] == ["ttft_p90_ms", "itl_median_ms"]
    assert [s.name for s in parse_slo("tpot_p99_ms=400,e2e_mean_ms=9000")] == ["tpot_p99_ms", "e2e_mean_ms"]
    assert parse_slo(None) == () == parse_slo([])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        (["tpot_p42_ms=400"], "NAME=MS with NAME one of"),
        (["latency=400"], "NAME=MS with NAME one of"),
        (["tpot_p99_ms=-1"], "a number of milliseconds > 0"),
        (["tpot_p99_ms=fast"], "a number of milliseconds > 0"),
        (["tpot_p99_ms"], "NAME=MS"),
    ],
)
def test_a_bad_slo_is_refused_by_name(spec: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match="slo") as err:
        parse_slo(spec)
    assert says in str(err.value)


def _level(per_gpu: float, per_user: float, meets: bool, goodput: float = 0.0) -> dict[str, Any]:
    return {"tok_s_per_gpu": per_gpu, "tok_s_per_user": per_user, "meets_slo": meets, "goodput_per_gpu": goodput}


def test_each_objective_scores_the_best_level_that_qualifies() -> None:
    levels = [_level(10.0, 50.0, True, 0.5), _level(40.0, 12.0, False, 0.2), _level(25.0, 30.0, True, 0.9)]
    assert Objective("throughput").score(levels) == 25.0  # the level that misses the SLO does not count
    slo = parse_slo(["tpot_p99_ms=100"])
    assert Objective("goodput", slo).score(levels) == 0.9
    assert Objective("interactivity", floor=20.0).score(levels) == 30.0  # 50 tok/s per user is under the floor
    assert Objective("interactivity").score(levels) == 50.0
    assert Objective("throughput").score([_level(10.0, 5.0, False)]) == 0.0
    assert Objective("throughput", slo).tpot_limit_ms == 100.0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"kind": "speed"}, "throughput, goodput, interactivity"),
        ({"kind": "goodput"}, "goodput with an SLO"),
        ({"kind": "interactivity", "floor": -1.0}, "tok/s >= 0"),
    ],
)
def test_a_bad_objective_is_refused_by_name(kwargs: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        Objective(**kwargs)
    assert says in str(err.value)


def test_the_model_rules_out_what_cannot_start_and_orders_the_rest() -> None:
    """Config B without its graph cap and with a high memory fraction cannot capture its graphs: such points are
    not in the order; among the rest, graphs that cover the concurrency come before graphs that do not."""
    dims = parse_space(["mem_fraction_static=0.80,0.92", "cuda_graph_max_bs=8,16,256"], FIELDS)
    points = grid(dims)
    base = preset("config_b_fixed")
    predictions = {i: preflight(base.replace(**p), "rtx-pro-6000-x8") for i, p in enumerate(points)}
    order = model_order(predictions, load_tokens=16 * 8256, top_bs=16)
    ruled_out = [points[i] for i in predictions if not predictions[i].fits]
    assert ruled_out, "some point of this space is predicted not to start"
    assert all(predictions[i].fits for i in order) and len(order) + len(ruled_out) == len(points)
    covers = [predictions[i].settings.cuda_graph_max_bs >= 16 for i in order]
    assert covers == sorted(covers, reverse=True), [points[i] for i in order]


def test_the_frontier_is_the_points_nothing_beats_on_both_axes() -> None:
    frame = pd.DataFrame(
        {
            "config": ["a", "a", "b", "b", "c"],
            "concurrency": [1, 16, 1, 16, 16],
            "tok_s_per_user": [60.0, 20.0, 50.0, 25.0, 10.0],
            "tok_s_per_gpu": [5.0, 40.0, 4.0, 30.0, 35.0],
            "meets_slo": [True, True, True, False, True],
        }
    )
    assert pareto_front(frame).tolist() == [True, True, False, True, False]
    nan = frame.assign(tok_s_per_user=[math.nan, 20.0, 50.0, 25.0, 10.0])
    assert pareto_front(nan).tolist()[0] is False


def test_the_frontier_chart_says_its_axes_clock_cut_and_choice() -> None:
    frame = pd.DataFrame(
        {
            "config": ["mem=0.6", "mem=0.6", "mem=0.7"],
            "concurrency": [1, 16, 16],
            "tok_s_per_user": [60.0, 20.0, 25.0],
            "tok_s_per_gpu": [5.0, 40.0, 45.0],
            "meets_slo": [True, False, True],
        }
    )
    svg = to_svg(frontier_chart(frame, clock=Clock.twin(0.02, "rtx-pro-6000-x8"), tpot_limit_ms=40.0, chosen="mem=0.7"))
    for text in (
        "output throughput per GPU (tok/s, modelled hardware)",
        "interactivity: output tok/s per user (1000 / median TPOT, modelled hardware)",
        "TPOT SLO missed (TPOT &gt; 40 ms)",
        "mem=0.7 (chosen)",
        "hollow triangles miss an SLO",
    ):
        assert text in svg, text
    with pytest.raises(Exception, match="columns"):
        frontier_chart(frame.drop(columns=["meets_slo"]))
    # A trial cut short by a Stop is a row without figures: its NaN makes the flags objects.
    cut = pd.concat([frame, pd.DataFrame([{"config": "mem=0.8", "concurrency": None}])], ignore_index=True)
    assert cut["meets_slo"].dtype == object
    assert "hollow triangles miss an SLO" in to_svg(frontier_chart(cut, chosen="mem=0.7"))


def test_any_campaigns_or_sweeps_measurements_give_frontier_rows() -> None:
    """The headline per config and concurrency, per GPU and per user; a measurement without a TPOT or a GPU
    count (recorded before they were) is left out rather than guessed."""
    from dsv4lab.notebook.measurements import Measurement, frontier_rows

    items = [
        Measurement("config-a", 16, 160.0, 3, "8,000 in / 256 out", "A/B", tpot_ms=100.0, gpus=8),
        Measurement("config-a", 16, 150.0, 1, "8,000 in / 256 out", "benchmark", tpot_ms=110.0, gpus=8),
        Measurement("config-b", 1, 24.0, 3, "8,000 in / 256 out", "A/B", tpot_ms=40.0, gpus=8),
        Measurement("old", 1, 20.0, 1, "", "benchmark"),
    ]
    rows = frontier_rows(items)
    assert [(r["config"], r["concurrency"]) for r in rows] == [("config-a", 16), ("config-b", 1)]
    assert rows[0]["tok_s_per_gpu"] == 20.0 and rows[0]["tok_s_per_user"] == 10.0  # the A/B's 3 repeats lead
    assert rows[1]["tok_s_per_user"] == 25.0
    assert Measurement.from_dict(items[0].to_dict()) == items[0]
