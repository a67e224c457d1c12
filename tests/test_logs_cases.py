"""Every real log in shared/logs must diagnose to its labels (engine, outcome, phase, OOM figures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.logs import Outcome, classify_line, detect_engine, diagnose, parse_log
from tests.conftest import require

SHARED_LOGS = Path(__file__).resolve().parents[2] / "shared" / "logs"
CASES = sorted(SHARED_LOGS.glob("case_*.log")) if SHARED_LOGS.is_dir() else []


def _labels(log: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(log.with_suffix(".json").read_text(encoding="utf-8"))
    return data


def test_shared_logs_present() -> None:
    require(SHARED_LOGS.is_dir() and bool(CASES), "shared/logs")


@pytest.mark.parametrize("log", CASES, ids=[c.stem for c in CASES])
def test_case_diagnosis_matches_labels(log: Path) -> None:
    labels = _labels(log)
    d = diagnose(log)
    got = d.to_dict()
    assert got["engine"] == labels["engine"]
    assert got["outcome"] == labels["outcome"], got["cause"]
    assert got["phase"] == labels["phase"], got["cause"]
    if labels.get("oom_gpu") is not None:
        assert got["gpu"] == labels["oom_gpu"]
    if labels.get("oom_tried_to_allocate_gib") is not None:
        assert got["tried_to_allocate_gib"] == pytest.approx(labels["oom_tried_to_allocate_gib"], rel=1e-3)
    if labels.get("gpu_total_gib") is not None:
        assert got["total_gib"] == pytest.approx(labels["gpu_total_gib"], rel=1e-3)
    if labels.get("free_gib_at_oom") is not None:
        assert got["free_gib"] == pytest.approx(labels["free_gib_at_oom"], rel=1e-2)
    # The contract: one sentence of cause, evidence, fixes with change/why, a confidence in [0, 1].
    assert got["cause"] and got["cause"].endswith(".")
    assert 0.0 <= got["confidence"] <= 1.0
    assert all(set(f) == {"change", "why"} for f in got["fixes"])
    if d.outcome in (Outcome.OOM, Outcome.CRASH):
        assert got["evidence"], "a failure must quote its evidence"
    if d.outcome is Outcome.CRASH:
        assert not any("mem-fraction" in f["change"] for f in got["fixes"]), "a crash is not blamed on memory"
    json.dumps(got)  # JSON-able


@pytest.mark.parametrize("log", CASES, ids=[c.stem for c in CASES])
def test_case_parses_and_detects(log: Path) -> None:
    labels = _labels(log)
    events = list(parse_log(log))
    assert events, "every case has at least one event"
    assert detect_engine(log) == labels["engine"]
    for line in log.read_text(encoding="utf-8").splitlines():
        classify_line(line)  # never raises
