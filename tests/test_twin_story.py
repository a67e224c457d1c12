"""The story must emerge from the twin: run the real launch scripts (target twin) for the three steps.

Config A at 0.70 starts; Config B at 0.70 dies in CUDA-graph capture on GPU 1 with SGLang's whole crash
chain and exit status 137, leaving a log that never changes; Config B-fixed (0.60, graphs up to bs 16)
starts. Nothing here tells the twin what should happen: the outcomes come from the memory model.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dsv4lab.config.hardware import hardware_profile
from dsv4lab.config.launch_script import render_env_file, render_launch_script
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.rundir import RunLayout
from dsv4lab.twin.kernels import config_file_name
from tests.test_twin_support import PY, check_log, free_port, kill_tree, wait_for

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

SCALE = "0.02"
TIMEOUT_S = 40.0


def _launch(tmp: Path, name: str, config: ServerConfig, version: str) -> tuple[RunLayout, subprocess.Popen[bytes]]:
    run = tmp / name
    run.mkdir()
    layout = RunLayout(str(run))
    Path(layout.env_file).write_text(render_env_file(config))
    script = render_launch_script(
        config,
        run_dir=str(run),
        sglang_version=version,
        python=PY,
        target="twin",
        twin_env={
            "DSV4LAB_TWIN_HARDWARE": "rtx-pro-6000-x8",
            "DSV4LAB_TWIN_PACE": SCALE,
            "DSV4LAB_TWIN_STATE_DIR": str(tmp / "state"),
        },
    )
    Path(layout.script).write_text(script)
    return layout, subprocess.Popen(["bash", layout.script], cwd=run)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[RunLayout, subprocess.Popen[bytes]]]]:
    tmp = tmp_path_factory.mktemp("story")
    kernels = tmp / "kernels"
    kernels.mkdir()
    hw = hardware_profile("rtx-pro-6000-x8")
    for n, k in ((1024, 4096), (4096, 1024)):
        (kernels / config_file_name(n, k, hw)).write_text("{}")
    runs = {
        "A": (config_a(), "0.5.23"),
        "B": (config_b(), "0.5.23"),
        "B-fixed": (config_b_fixed(), "0.5.23"),
        "B-0.5.4": (config_b(), "0.5.4"),
    }
    launched = {}
    for name, (cfg, version) in runs.items():
        cfg = cfg.replace(kernel_config_dir=str(kernels), port=free_port())
        launched[name] = _launch(tmp, name, cfg, version)
    try:
        yield launched
    finally:
        for _, proc in launched.values():
            kill_tree(proc.pid)


def _log(layout: RunLayout) -> str:
    return Path(layout.log).read_text(errors="replace")


@pytest.mark.parametrize("name", ["B", "B-0.5.4"])
def test_config_b_dies_in_graph_capture_on_gpu1(
    story: dict[str, tuple[RunLayout, subprocess.Popen[bytes]]], name: str
) -> None:
    layout, proc = story[name]
    wait_for(lambda: Path(layout.server_exit).exists(), TIMEOUT_S, f"{name} to exit")
    assert Path(layout.server_exit).read_text().strip() == "137"
    proc.wait(timeout=10)
    log = _log(layout)
    first = next(line for line in log.splitlines() if "Scheduler hit an exception" in line)
    assert " TP1] Scheduler hit an exception" in first
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate" in log
    assert "Exception: Capture cuda graph failed: CUDA out of memory" in log
    assert "GPU 1 has a total capacity of 95.59 GiB" in log
    assert "Possible solutions:" in log
    assert "Received sigquit from a child process. It usually means the child failed." in log
    kill_line = "kill_process_tree called: parent_pid="
    if name == "B":
        assert "--cuda-graph-max-bs-decode to a smaller value" in log
        records = [line for line in log.splitlines() if line.startswith("[")]
        assert kill_line in records[-1] and "include_parent=True" in records[-1]
    else:
        assert kill_line not in log
        assert "--cuda-graph-max-bs to a smaller value" in log
    assert check_log(log) == []
    # Dead means dead: no process of the tree is left, and the log never changes again.
    pid = int(Path(layout.server_pid).read_text())
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    size = Path(layout.log).stat().st_size
    time.sleep(0.5)
    assert Path(layout.log).stat().st_size == size


def test_config_b_diagnosis_by_the_log_reader(story: dict[str, tuple[RunLayout, subprocess.Popen[bytes]]]) -> None:
    logs = pytest.importorskip("dsv4lab.logs")
    layout, _ = story["B"]
    wait_for(lambda: Path(layout.server_exit).exists(), TIMEOUT_S, "B to exit")
    d = logs.diagnose(Path(layout.log))
    assert d.outcome.name == "OOM"
    assert d.gpu == 1
    assert d.phase.name == "CUDA_GRAPH_CAPTURE"


@pytest.mark.parametrize("name", ["A", "B-fixed"])
def test_config_a_and_b_fixed_start(story: dict[str, tuple[RunLayout, subprocess.Popen[bytes]]], name: str) -> None:
    layout, proc = story[name]
    wait_for(lambda: "The server is fired up and ready to roll!" in _log(layout), TIMEOUT_S, f"{name} ready")
    assert proc.poll() is None and not Path(layout.server_exit).exists()
    log = _log(layout)
    assert "Scheduler hit an exception" not in log
    assert "Using configuration from" in log and "for W8A8 Block FP8 kernel." in log
    assert "max_total_num_tokens=" in log
    if name == "B-fixed":
        assert "Capture target verify CUDA graph end. bs=[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]" in log
        assert "Capture draft extend CUDA graph begin." in log
        assert "type=DeepseekV4ForCausalLMNextN" in log
    else:
        assert "Capture target decode CUDA graph end." in log
    # The uvicorn lines come only after every scheduler is ready.
    lines = log.splitlines()
    ready_at = max(i for i, line in enumerate(lines) if "max_total_num_tokens=" in line)
    assert all("Uvicorn running" not in line for line in lines[:ready_at])
    assert check_log(log) == []
