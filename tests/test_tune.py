"""Tuning on the twin: the CLI contract, the model's rulings before any launch, every trial an ordinary run dir,
the offline index with its frontier, and Stop in a real kernel keeping the finished trials."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kernel import Kernel
from tests.test_faults_support import no_processes_left

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

#: Six points, two of which (no graph cap) the memory model says cannot capture their graphs.
SPACE = ["--space", "mem_fraction_static=0.80,0.92", "--space", "cuda_graph_max_bs=8,16,256"]
#: A short workload on a fast twin clock: three trials in about half a minute.
LOAD = ["--concurrency", "16", "--input-len", "1000", "--output-len", "32", "--pace", "0.02"]


def _tune(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSV4LAB_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", "tune", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_tune_follows_the_cli_contract_and_launches_only_what_the_model_lets_start(tmp_path: Path) -> None:
    out = _tune(
        tmp_path,
        "--preset", "config_b_fixed", "--twin", *SPACE, "--objective", "throughput", *LOAD,
        "--slo", "tpot_p99_ms=2000", "--budget", "3", "--reports", str(tmp_path / "reports"), "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    index = Path(lines[-1])
    assert index.name == "index.html" and index.is_file()
    result: dict[str, Any] = json.loads(lines[-2])
    assert {"best", "launches", "ruled_out", "trials"} <= set(result)

    # Ruled out before any launch, with the phase and the shortfall; never launched.
    assert sorted(p["cuda_graph_max_bs"] for p in result["ruled_out"]) == [256, 256]
    for point in result["ruled_out"]:
        assert point["predicted"].startswith("OOM in cuda_graph_capture, short by") and point["short_by_gib"] > 0
    launched = [t["values"] for t in result["trials"]]
    assert result["launches"] == len(launched) == 3
    assert all(v["cuda_graph_max_bs"] != 256 for v in launched)
    assert len({json.dumps(v, sort_keys=True) for v in launched}) == 3, "no point launched twice"
    assert result["trials"][0]["model_rank"] == 1, "the first launch is the model's best point"

    # Each trial an ordinary run dir: the server's record and its benchmark.
    for trial in result["trials"]:
        run_dir = Path(trial["run_dir"])
        assert json.loads((run_dir / "readiness.json").read_text())["verdict"] == trial["verdict"] == "READY"
        assert (run_dir / "bench" / "bench_results.jsonl").read_text().strip(), run_dir
        (level,) = trial["levels"]
        assert level["concurrency"] == 16 and level["completed"] == 16
        assert level["tok_s_per_gpu"] == pytest.approx(level["output_tok_s"] / 8)
        assert level["meets_slo"] == (level["tpot_p99_ms"] <= 2000)
        assert 0 <= level["good_requests"] <= 16
    best = result["best"]
    assert best is not None and best["score"] == max(t["score"] for t in result["trials"])
    assert set(best) >= {"mem_fraction_static", "cuda_graph_max_bs", "score", "run_dir"}

    # The index: offline, the frontier as inline SVG saying its axes, units and clock; the ruled-out table.
    page = index.read_text()
    assert not re.search(r"""(src|href)=["']https?://""", page)
    assert "<svg" in page and "output throughput per GPU (tok/s, modelled hardware)" in page
    assert f"trial {best['trial']} (chosen)" in page
    assert "Ruled out before any launch" in page and "short by" in page
    assert json.loads((index.parent / "tune.json").read_text())["launches"] == 3


def test_the_tuning_notebook_narrates_the_search_into_an_offline_report(tmp_path: Path) -> None:
    """``07_tune`` under papermill: the model's rulings, the trials, the frontier (inline SVG), the winner and its
    A/B against the base, in a report that fetches nothing."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSV4LAB_STATE_DIR": str(tmp_path / "state")}
    out = subprocess.run(
        [sys.executable, "-m", "dsv4lab", "run", "07_tune", "--reports", str(tmp_path / "reports"),
         "-p", "pace", "0.02", "-p", "budget", "3", "-p", "input_len", "1000", "-p", "output_len", "16",
         "-p", "space", "mem_fraction_static 0.80,0.92; cuda_graph_max_bs 8,16,256"],
        env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    report = Path(out.stdout.strip().splitlines()[-1])
    results = json.loads((report.parent / "results.json").read_text())
    figures = results["figures"]
    assert (figures["launches"], figures["grid_size"], figures["ruled_out"]) == (3, 6, 2)
    assert figures["best"]["cuda_graph_max_bs"] in (8, 16) and figures["tuned_gain"]["repeats"] == [3, 3]
    page = report.read_text()
    assert not re.search(r"""(src|href)=["']https?://""", page)
    assert 'src="data:image/svg+xml' in page or "<svg" in page
    for text in ("the memory model ruled out", "OOM in cuda_graph_capture", "The winner is trial", "95% CI"):
        assert text in page, text


def test_stop_in_a_kernel_keeps_the_finished_trials_and_stops_the_running_one(tmp_path: Path) -> None:
    k = Kernel(tmp_path)
    try:
        k.run(f"from dsv4lab import Lab\nlab = Lab(run_root={str(tmp_path / 'runs')!r}, pace=0.02, progress=False)")
        code = (
            'result = lab.tune("config_b_fixed", {"mem_fraction_static": [0.80, 0.92], "cuda_graph_max_bs": [8, 16]}, '
            "concurrency=16, input_len=1000, output_len=400, budget=4)"
        )
        cell = k.submit(code)
        # The Stop lands in the second trial's benchmark: its server is READY, and its bench (16 requests of 400
        # tokens, about 4 s) has begun. (Its bench folder appears only once the run is saved.)
        ready = tmp_path / "runs" / "trial-02" / "readiness.json"
        deadline = time.monotonic() + 120
        while '"READY"' not in (ready.read_text() if ready.is_file() else ""):
            assert time.monotonic() < deadline, "the second trial never came up"
            time.sleep(0.05)
        time.sleep(0.5)
        pressed = k.interrupt()
        result = k.collect(cell, timeout_s=60)
        assert result.status == "error" and result.ename == "Interrupted", (result.ename, result.evalue)
        assert result.replied_at - pressed < 2.0
        assert result.traceback[0].startswith("Stopped by the user: tune config_b_fixed, after 2 launches of 4")
        partial = "sys.last_value.partial"
        k.run("import sys")
        assert k.value(f"[t.status for t in {partial}.trials]") == "['ok', 'interrupted']"
        assert k.value(f"{partial}.best.number") == "1"
        # Each trial's log is a measurement of the graph pools: the result fits the memory model to them.
        k.run(f"fitted = {partial}.calibration()")
        assert k.value("len(fitted.points) > 0 and {p.max_bs for p in fitted.points} <= {8, 16}") == "True"
        assert k.value("'target' in fitted.fitted") == "True"
        (tune_json,) = (tmp_path / "runs").glob("tune-*/tune.json")
        saved = json.loads(tune_json.read_text())
        assert saved["interrupted"] is True and [t["status"] for t in saved["trials"]] == ["ok", "interrupted"]
        no_processes_left(tmp_path / "runs", timeout_s=30)
    finally:
        k.shutdown(now=True)
