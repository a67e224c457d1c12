"""The whole campaign on the twin: the story's numbers must emerge, and the report must be written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4lab.story import StorySettings, run_story


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("story")
    run_story(out, StorySettings(time_scale=0.02, base_port=32000), say=lambda _: None)
    return out


def test_the_story_emerges(story: Path) -> None:
    facts = json.loads((story / "facts.json").read_text())["steps"]
    a = facts["1-config-a"]
    assert 0.55 < a["attention_share"] < 0.70  # the sparse-MLA decode kernel, about 63% of GPU time
    assert "sparse_mla" in a["top_kernel"]
    assert 0.0 < a["fp8_gain"] < 0.12  # FP8 autotuning: about +6%
    b = facts["2-config-b"]
    assert b["verdict"] == "CRASHED" and b["exit_status"] == 137
    assert b["detected_after_s"] < 1.0
    assert 17 < b["short_by_gib"] < 23
    ab = facts["6-ab"]
    # MTP: +47% at concurrency 1 in steady decode (the twin's own tests hold that to +-10 points); a bench
    # run also counts prefill, so its gain is a little lower and noisier (39-47% over repeated trials).
    assert ab["c1"]["verdict"] == "better" and 0.30 <= ab["c1"]["rel"] <= 0.60
    assert ab["c16"]["verdict"] == "no detectable difference"  # ... and nothing at 16
    assert abs(ab["c16"]["rel"]) < 0.10
    assert 15 < ab["c16"]["a"] < 30  # about 23 output tok/s on the modelled hardware
    gap = facts["7-conclusion"]["gap"]
    assert gap > 20


def test_the_report_is_written(story: Path) -> None:
    md = (story / "README.md").read_text()
    for words in ("Config A", "CRASHED", "short by", "better", "no detectable difference", "gap of about"):
        assert words in md
    html = (story / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and "http" not in html.split("<body>")[0]
    assert (story / "runs" / "config-b" / "diagnosis.json").exists()
    assert (story / "ab.csv").exists() and (story / "kernels-config-a.csv").exists()
