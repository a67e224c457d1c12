"""vLLM's memory preflight against a REAL vLLM (the CPU build serving the tiny random Llama).

The two memory failures of vLLM's CPU build, predicted and then checked against the server itself:

- a ``VLLM_CPU_KVCACHE_SPACE`` far above the host's memory: ``dsv4lab preflight`` says it does not fit, and
  ``dsv4lab launch --engine vllm`` refuses before anything is written or started (no vLLM start: a second);
- a KV space too small for ``max_model_len``: predicted with vLLM's own figures (the GiB needed, the GiB
  available, its estimate of the longest context), refused by ``launch``. Launched with the preflight
  bypassed, the real server stops with exactly those figures, on the memory node the preflight read: the
  real-engine campaign shows that (``tests/test_vllm_campaign.py``), so no vLLM starts here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import psutil
import pytest

from dsv4lab.hosts import open_host
from dsv4lab.serving.hostmem import read_host_memory
from tests.sshd import free_port
from tests.vllmserver import VENV, cli

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

PYTHON = str(VENV / "bin" / "python")
#: How long the failing start-up may take: ~40 s on two idle cores, several times that beside a busy suite.
WATCH_TIMEOUT_S = 420


def _sets(model: Path, port: int, *extra: str) -> list[str]:
    return [
        "--set", f"model_path={model}", "--set", "dtype=float32", "--set", "enforce_eager=true",
        "--set", "env.HF_HUB_OFFLINE=1", "--set", f"port={port}", *extra,
    ]  # fmt: skip


def _started_from(run_dir: Path) -> list[psutil.Process]:
    """Processes whose command line names ``run_dir`` (a launch script or a server started from it)."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if any(str(run_dir) in word for word in p.info["cmdline"] or ()):
            out.append(p)
    return out


def test_a_kv_space_above_the_hosts_memory_is_refused_before_launch(
    vllm_model: Path, cli_env: dict[str, str], tmp_path: Path
) -> None:
    memory = read_host_memory(open_host(None))
    space = math.ceil(memory.total_gib) + 64  # far above what the memory node has
    sets = _sets(vllm_model, free_port(), "--set", "max_model_len=1024", "--set", f"env.VLLM_CPU_KVCACHE_SPACE={space}")

    predicted = json.loads(cli("preflight", "--engine", "vllm", *sets, "--json", env=cli_env).stdout)
    assert predicted["fits"] is False and predicted["fail_phase"] == "kv_cache_alloc", predicted
    # Short by the space minus what is left of the node once vLLM is in: more than the space - available.
    assert predicted["short_by_gib"] >= space - memory.available_gib
    assert predicted["field"] == "env.VLLM_CPU_KVCACHE_SPACE" and predicted["fix"].startswith("VLLM_CPU_KVCACHE_SPACE=")
    assert predicted["host_memory"]["node"] == memory.node

    run_dir = tmp_path / "run"
    refused = cli("launch", "--engine", "vllm", *sets, "--python", PYTHON, "--run-dir", str(run_dir), env=cli_env)
    assert refused.returncode == 2, (refused.stdout, refused.stderr)
    error = refused.stderr.strip()
    assert error.startswith(f"Error: env.VLLM_CPU_KVCACHE_SPACE='{space}' is not valid: a value that fits: "), error
    assert f"asks for {space:.2f} GiB" in error and "GiB available" in error and "VLLM_CPU_KVCACHE_SPACE=" in error
    # Nothing was written and nothing started.
    assert not run_dir.exists()
    assert not _started_from(run_dir)


def test_a_kv_space_too_small_for_max_model_len_is_predicted_and_refused(
    vllm_model: Path, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # 1 GiB of float32 KV for 2 layers x 4 heads x 32: 4,096 blocks of 128 tokens; 600,000 tokens need 4,688.
    sets = _sets(
        vllm_model, free_port(), "--set", "max_model_len=600000", "--set", "env.VLLM_CPU_KVCACHE_SPACE=1",
        "--set", "env.VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
    )  # fmt: skip
    predicted = json.loads(cli("preflight", "--engine", "vllm", *sets, "--json", env=cli_env).stdout)
    assert predicted["fits"] is False and predicted["fail_phase"] == "kv_cache_alloc", predicted
    kv = predicted["kv"]
    assert (kv["estimated_max_model_len"], kv["needed_gib"], kv["kv_gib"]) == (524160, 1.145, 1.0)
    assert predicted["field"] == "max_model_len" and "max_model_len=524160" in predicted["fix"]

    run_dir = tmp_path / "run"
    refused = cli("launch", "--engine", "vllm", *sets, "--python", PYTHON, "--run-dir", str(run_dir), env=cli_env)
    assert refused.returncode == 2 and "max_model_len=600000" in refused.stderr, refused.stderr
    assert not run_dir.exists()

    # The same config launched with the check bypassed, the real server stopping the way predicted, is the
    # real-engine campaign's failure step (tests/test_vllm_campaign.py): one vLLM start fewer here.
