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

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.sshd import free_port
from tests.vllmserver import HELPERS, VENV, cli, gone, roles

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

PYTHON = str(VENV / "bin" / "python")
#: Start-up is ~40 s on two idle cores with --enforce-eager, several times that beside a busy suite.
READY_TIMEOUT_S = 420


def _launch_args(model: Path, run_dir: Path, port: int, *extra: str) -> list[str]:
    return [
        "launch", "--engine", "vllm",
        "--set", f"model_path={model}", "--set", "max_model_len=1024", "--set", "dtype=float32",
        "--set", "enforce_eager=true", "--set", "env.VLLM_CPU_KVCACHE_SPACE=1", "--set", "env.HF_HUB_OFFLINE=1",
        "--set", f"port={port}", *extra,
        "--python", PYTHON, "--run-dir", str(run_dir), "--json",
    ]  # fmt: skip


def test_launch_watch_bench_kill_and_stop_a_real_vllm(
    vllm_model: Path, cli_env: dict[str, str], tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    port = free_port()
    started = cli(*_launch_args(vllm_model, run_dir, port), env=cli_env)
    assert started.returncode == 0, started.stderr
    handle = json.loads(started.stdout)
    assert handle["target"] == "vllm" and handle["version"] == "0.32.0" and handle["port"] == port
    script = (run_dir / "launch.sh").read_text()
    assert "vllm.entrypoints.cli.main serve" in script and "--enforce-eager" in script
    pgid = int(handle["launcher_pid"])
    try:
        watched = cli("watch", str(run_dir), "--json", "--timeout", str(READY_TIMEOUT_S), env=cli_env)
        verdict = json.loads(watched.stdout)
        assert verdict["verdict"] == "READY", (verdict, (run_dir / "server.log").read_text()[-3000:])
        assert roles(pgid) >= HELPERS, roles(pgid)  # the helpers that outlive a killed server

        bench = [
            "bench", "--run-dir", str(run_dir), "--backend", "vllm", "--dataset-name", "random",
            "--input-len", "64", "--output-len", "32", "--num-prompts", "40", "--concurrency", "4", "--json",
        ]  # fmt: skip
        measured = cli(*bench, env=cli_env)
        assert measured.returncode == 0, measured.stderr
        result = _first_run(json.loads(measured.stdout))
        assert result["engine"] == "vllm" and result["engine_version"] == "0.32.0"
        assert result["completed"] == 40 and result["failed"] == 0 and result["output_throughput"] > 0

        # SIGKILL the API server in the middle of a longer benchmark.
        long_bench = [*bench[:-1], "--num-prompts", "400", "--output-len", "64", "--json"]
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsv4lab", *long_bench], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env
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
        left = gone(pgid)
        assert not left, [(p.pid, p.name()) for p in left]
        after = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "30", env=cli_env).stdout)
        assert after["verdict"] == "CRASHED" and after["exit_status"] == 137, after
    finally:
        stopped = cli("stop", str(run_dir), env=cli_env, timeout_s=120)
        assert stopped.returncode == 0, stopped.stderr
        assert not gone(pgid), "processes of the server's group outlived dsv4lab stop"


def test_stop_ends_the_whole_tree_of_a_running_vllm(vllm_model: Path, cli_env: dict[str, str], tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    handle = json.loads(cli(*_launch_args(vllm_model, run_dir, free_port()), env=cli_env).stdout)
    pgid = int(handle["launcher_pid"])
    try:
        # Stop during start-up, once the engine's processes exist: the API server, EngineCore, worker.
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not roles(pgid) >= HELPERS and time.monotonic() < deadline:
            time.sleep(0.5)
        assert roles(pgid) >= HELPERS, roles(pgid)
    finally:
        stopped = cli("stop", str(run_dir), env=cli_env, timeout_s=120)
    assert stopped.returncode == 0, stopped.stderr
    assert not gone(pgid, within_s=5.0)
    verdict = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "10", env=cli_env).stdout)
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
    vllm_model: Path, cli_env: dict[str, str], tmp_path: Path, extra: list[str], cause: str
) -> None:
    run_dir = tmp_path / "run"
    args = _launch_args(vllm_model, run_dir, free_port(), *extra)
    started = cli(*args, env=cli_env)
    assert started.returncode == 0, started.stderr
    pgid = int(json.loads(started.stdout)["launcher_pid"])
    verdict = json.loads(cli("watch", str(run_dir), "--json", "--timeout", "240", env=cli_env).stdout)
    assert verdict["verdict"] == "CRASHED", verdict
    assert verdict["exit_status"] != 0, verdict  # None: judged from the fatal line before the exit
    diagnosis: dict[str, Any] = verdict["diagnosis"] or {}
    text = json.dumps(diagnosis).lower()
    assert cause in text, diagnosis
    assert not gone(pgid)


def _first_run(data: Any) -> dict[str, Any]:
    if isinstance(data, dict) and "runs" in data:
        data = data["runs"]
    if isinstance(data, list):
        data = data[0]
    assert isinstance(data, dict), data
    return data
