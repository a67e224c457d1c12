"""Observed memory budgets from logs, next to the memory model's prediction; phases and the OOM point;
the decode roofline against the reference figures."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest

from dsv4lab.config.presets import config_b, config_b_fixed
from dsv4lab.hosts import LocalHost
from dsv4lab.model.budget import (
    CATEGORIES,
    budget_frame,
    compare_budgets,
    observed_budget,
    oom_point,
    phases_frame,
    phases_from_log,
)
from dsv4lab.model.memory import preflight
from dsv4lab.model.roofline import decode_roofline
from dsv4lab.serving.launch import launch
from dsv4lab.serving.watch import Verdict, wait_ready
from tests.sshd import free_port

DATA = Path(__file__).parent / "data" / "logs"
HW = "rtx-pro-6000-x8"
VERSION = "0.5.23"


@pytest.fixture(scope="module")
def twin_logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The twin's startup logs of Config B (OOM) and Config B-fixed (ready), at 1/50 of real time."""
    tmp = tmp_path_factory.mktemp("budget")
    env = {"DSV4LAB_TWIN_PACE": "0.02", "DSV4LAB_TWIN_STATE_DIR": str(tmp / "state"), "SGLANG_LOG_MS": "1"}
    logs: dict[str, Path] = {}
    for name, cfg, verdict in (("B", config_b(), Verdict.CRASHED), ("B-fixed", config_b_fixed(), Verdict.READY)):
        h = launch(
            LocalHost(),
            cfg.replace(port=free_port(), kernel_config_dir=None),
            str(tmp / name),
            target="twin",
            sglang_version=VERSION,
            twin_env=env,
        )
        try:
            assert wait_ready(h, 120, progress=False).verdict is verdict
        finally:
            h.stop(grace_s=1.0)
        logs[name] = Path(h.log_path)
    return logs


def test_config_b_observed_agrees_with_predicted_within_the_stated_error(twin_logs: dict[str, Path]) -> None:
    predicted = preflight(config_b(), HW, sglang_version=VERSION)
    observed = observed_budget(twin_logs["B"], hardware=HW)
    assert observed.failing_gpu == 1 == predicted.failing_gpu.gpu  # type: ignore[union-attr]
    assert not observed.ready
    table = compare_budgets(predicted, observed)
    checked = table[table["agrees"].notna()]
    # Every GPU's weights, draft weights, KV pool, buffers and context were compared...
    assert set(checked["category"]) == {"other", "weights", "draft weights", "KV pool", "buffers"}
    assert len(checked) == 8 * 5
    bad = checked[~checked["agrees"].astype(bool)]
    assert bad.empty, bad.to_string()
    # ...graph pools and free space are not the same quantity on a GPU whose capture stopped.
    g1 = observed.gpu(1)
    assert g1.short_gib is not None and 0 < g1.short_gib < g1.total_gib  # type: ignore[operator]
    assert g1.graphs_gib is not None and g1.graphs_gib < predicted.per_gpu[1].graphs_gib
    # The failing GPU's stack fills the card: context + weights + KV + buffers + graphs so far + free.
    parts = [v for k, v in g1.categories().items() if k != "short"]
    assert all(v is not None for v in parts)
    assert sum(v for v in parts if v is not None) == pytest.approx(g1.total_gib, abs=0.1)
    # The whole capture is predicted 20 GiB short; the failed allocation alone is a few GiB over.
    assert predicted.short_by_gib is not None and predicted.short_by_gib > 4 * g1.short_gib


def test_config_b_fixed_agrees_in_every_category(twin_logs: dict[str, Path]) -> None:
    predicted = preflight(config_b_fixed(), HW, sglang_version=VERSION)
    observed = observed_budget(twin_logs["B-fixed"], hardware=HW)
    assert observed.ready and observed.oom is None
    table = compare_budgets(predicted, observed)
    checked = table[table["agrees"].notna()]
    assert {"graph pools", "free"} <= set(checked["category"])
    bad = checked[~checked["agrees"].astype(bool)]
    assert bad.empty, bad.to_string()
    # Rank 0 logs the draft capture; the other ranks take its figure and say so.
    assert observed.gpu(0).estimated == ()
    assert "graph pools" in observed.gpu(3).estimated


def test_budget_frame_is_tidy_and_stacks_to_the_card(twin_logs: dict[str, Path]) -> None:
    predicted = preflight(config_b(), HW, sglang_version=VERSION)
    observed = observed_budget(twin_logs["B"], hardware=HW)
    frame = budget_frame(predicted, observed, config="Config B", gpus=[1])
    assert list(frame.columns) == ["config", "gpu", "source", "category", "gib", "order", "estimated", "total_gib"]
    assert set(frame["source"]) == {"predicted", "observed"} and set(frame["gpu"]) == {1}
    assert set(frame["category"]) <= set(CATEGORIES)
    pred = frame[frame["source"] == "predicted"].set_index("category")["gib"]
    total = float(frame["total_gib"].iloc[0])
    # Predicted: the part that fits reaches the card's capacity exactly; "short" sits above it.
    assert pred.drop("short").sum() == pytest.approx(total, abs=1e-6)
    assert pred["short"] == pytest.approx(predicted.per_gpu[1].short_by_gib)


def test_phases_and_the_oom_point_of_config_b(twin_logs: dict[str, Path]) -> None:
    utc = dt.timezone.utc
    spans = phases_from_log(twin_logs["B"], tz=utc)
    assert [s.name for s in spans] == ["init", "weights", "KV pool", "CUDA graph capture", "crash"]
    assert all(a.end == b.start for a, b in itertools.pairwise(spans))
    assert all(s.start.tzinfo is not None and s.seconds >= 0 for s in spans)
    assert spans[1].seconds > spans[2].seconds  # weights load far longer than the KV pool takes
    # SGLANG_LOG_MS=1: sub-second bounds survive.
    assert any(s.start.microsecond for s in spans)
    oom = oom_point(twin_logs["B"], tz=utc)
    assert oom is not None and oom.gpu == 1 and oom.phase == "CUDA graph capture"
    assert oom.time == spans[-1].start
    assert oom.label().startswith("OOM on GPU 1: tried ") and "GiB free" in oom.label()
    frame = phases_frame(spans)
    assert list(frame["phase"]) == [s.name for s in spans]


def test_phases_of_a_ready_server_with_draft_graphs(twin_logs: dict[str, Path]) -> None:
    names = [s.name for s in phases_from_log(twin_logs["B-fixed"])]
    assert names == [
        "init",
        "weights",
        "KV pool",
        "CUDA graph capture",
        "draft CUDA graph capture",
        "warmup",
        "serving",
    ]
    assert oom_point(twin_logs["B-fixed"]) is None


def test_host_timezone_moves_the_instants() -> None:
    log = DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log"
    utc = phases_from_log(log, tz=dt.timezone.utc)
    east = phases_from_log(log, tz=dt.timezone(dt.timedelta(hours=8)))
    assert [s.start.hour for s in utc] == [s.start.hour for s in east]  # same wall clock ...
    assert (utc[0].start - east[0].start).total_seconds() == 8 * 3600  # ... different instants


def test_a_real_0_5_4_log() -> None:
    log = DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log"
    ob = observed_budget(log)
    assert [g.gpu for g in ob.per_gpu] == [0, 1]
    g1 = ob.gpu(1)
    assert g1.total_gib == pytest.approx(94.97)  # from the OOM message: no hardware given
    assert g1.weights_gib == pytest.approx(38.0) and g1.kv_pool_gib == pytest.approx(23.6)
    assert g1.free_gib == pytest.approx(1.2) and g1.short_gib == pytest.approx(1.3)
    # The capture progress bar shows what the first capture registered before its first graph.
    assert g1.buffers_gib == pytest.approx(0.2, abs=1e-6)
    assert ob.gpu(0).graphs_gib is None  # rank 0 was torn down mid-capture: unknown, not zero
    assert [s.name for s in phases_from_log(log)][-2:] == ["CUDA graph capture", "crash"]


def test_decode_roofline_matches_the_reference_figures() -> None:
    # reference/memory.md §8.2: about 790 tok/s per stream at B=1, about 3,350 in total at B=16 (TP8, 8K).
    one = decode_roofline(HW, concurrency=1)
    sixteen = decode_roofline(HW, concurrency=16)
    assert one.tok_s == pytest.approx(790, rel=0.1)
    assert sixteen.tok_s == pytest.approx(3350, rel=0.1)
    assert sixteen.bytes_per_step > 3 * one.bytes_per_step  # the experts 16 tokens touch
    mtp = decode_roofline(HW, concurrency=16, query_tokens=2, accepted_per_step=1.7)
    assert sixteen.tok_s < mtp.tok_s < 1.7 * sixteen.tok_s
