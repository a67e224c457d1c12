"""The story's diagnosis, with the memory model's arithmetic, on logs the twin writes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4lab.config.hardware import model_profile
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.hosts import LocalHost
from dsv4lab.logs import Outcome, Phase
from dsv4lab.model.calibration import calibrate, config_from_server_args, hardware_for_total
from dsv4lab.model.diagnosis import diagnose_with_model
from dsv4lab.model.memory import preflight
from dsv4lab.serving.launch import launch
from dsv4lab.serving.watch import wait_ready
from tests.sshd import free_port


@pytest.fixture(scope="module")
def story_logs(tmp_path_factory: pytest.TempPathFactory, tuned_kernel_dir: str) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("story")
    out: dict[str, Path] = {}
    for name, config in (("a", config_a()), ("b", config_b())):
        h = launch(
            LocalHost(),
            config.replace(port=free_port(), kernel_config_dir=tuned_kernel_dir),
            str(root / name),
            target="twin",
            twin_env={"DSV4LAB_TWIN_PACE": "0.02"},
        )
        wait_ready(h, 120, progress=False)
        h.stop(grace_s=1)
        out[name] = Path(h.log_path)
    return out


def test_config_b_log_is_diagnosed_with_the_shortfall(story_logs: dict[str, Path]) -> None:
    d = diagnose_with_model(story_logs["b"])
    assert d.outcome is Outcome.OOM and d.phase is Phase.CUDA_GRAPH_CAPTURE and d.gpu == 1
    assert 17 < d.figures["model_short_by_gib"] < 23
    assert any("short by" in n and "GPU 1" in n for n in d.notes)
    changes = [f.change for f in d.fixes]
    assert "--cuda-graph-max-bs-decode 16" in changes
    assert any(c.startswith("--mem-fraction-static 0.6") for c in changes)
    both = next(f for f in d.fixes if "--mem-fraction-static" in f.change and "--cuda-graph-max-bs-decode" in f.change)
    assert "fits" in both.why
    cap = next(f for f in d.fixes if f.change == "--cuda-graph-max-bs-decode 16")
    assert "predicts it fits" in cap.why


def test_cli_diagnose_json_contract(story_logs: dict[str, Path]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dsv4lab", "diagnose", str(story_logs["b"]), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for key in (
        "engine",
        "outcome",
        "phase",
        "gpu",
        "tried_to_allocate_gib",
        "free_gib",
        "total_gib",
        "cause",
        "evidence",
        "fixes",
        "confidence",
    ):
        assert key in out
    assert (out["engine"], out["outcome"], out["phase"], out["gpu"]) == ("sglang", "oom", "cuda_graph_capture", 1)
    assert all({"change", "why"} <= set(f) for f in out["fixes"])
    assert 0 <= out["confidence"] <= 1
    missing = subprocess.run(
        [sys.executable, "-m", "dsv4lab", "diagnose", "/no/such.log", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 2 and missing.stderr.startswith("Error: LOGFILE")


def test_ready_log_is_left_alone(story_logs: dict[str, Path]) -> None:
    d = diagnose_with_model(story_logs["a"])
    assert d.outcome is Outcome.READY
    assert not any(n.startswith("Memory model") for n in d.notes)


def test_calibrate_recovers_the_graph_slope(story_logs: dict[str, Path]) -> None:
    truth = model_profile("deepseek-v4-flash").graphs.target_b_gib
    c = calibrate(story_logs["a"])
    assert "target" in c.fitted and len(c.points) >= 1
    assert c.model.graphs.target_b_gib == pytest.approx(truth, rel=0.05)
    assert "fitted from" in c.describe()
    # A failed log has no completed capture: nothing to fit, estimates stay.
    assert calibrate(story_logs["b"]).fitted == ()


def test_calibration_changes_predictions() -> None:
    lines_small = [
        "[2026-01-01 00:00:00] server_args=ServerArgs(model_path='deepseek-ai/DeepSeek-V4-Flash', tp_size=8, "
        "mem_fraction_static=0.7)",
        "[2026-01-01 00:00:01 TP0] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 16], elapsed=1.00 s, "
        "mem usage=3.50 GB, avail mem=20.00 GB.",
    ]
    lines_big = [lines_small[0], lines_small[1].replace("8, 16]", "8, 16, 64]").replace("3.50", "6.50")]
    c = calibrate(lines_small, lines_big)
    # Two batch sizes: both intercept and slope are fitted (64 - 16 = 48 slots cost 3 GiB).
    assert c.model.graphs.target_b_gib == pytest.approx(3.0 / 48, rel=0.01)
    assert c.model.graphs.target_a_gib == pytest.approx(2.5 - 16 * 3.0 / 48, abs=0.01)
    # ... and later predictions use them: Config A's decode graphs at bs 256 as the fitted line says.
    p = preflight(config_a(), model=c.model)
    assert p.graphs[0].gib == pytest.approx(c.model.graphs.target_a_gib + 256 * c.model.graphs.target_b_gib)
    assert p.graphs[0].gib != pytest.approx(preflight(config_a()).graphs[0].gib)


def test_config_from_server_args_and_hardware() -> None:
    cfg = config_from_server_args(
        {
            "model_path": "m",
            "tp_size": 8,
            "mem_fraction_static": 0.7,
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 1,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 2,
            "cuda_graph_max_bs_decode": 16,
        }
    )
    assert cfg.speculative is not None and cfg.speculative.num_draft_tokens == 2 and cfg.cuda_graph_max_bs == 16
    assert cfg == config_b_fixed().replace(
        model_path="m", mem_fraction_static=0.7, env={}, kernel_config_dir=None, trust_remote_code=False
    )
    hw = hardware_for_total(95.59, 8)
    assert hw is not None and hw.name == "rtx-pro-6000-x8"
    assert hardware_for_total(40.0, 8) is None
