"""Rendered argv must be accepted by the real ``sglang.launch_server`` parser of each release.

The parsers run in small per-release venvs built by ``tools/sglang_parser_venvs.sh`` (``make test`` builds
them; CPU torch, no GPU). One interpreter per release checks a batch of argv lists.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.config.launch_script import render_argv
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from tests.conftest import require

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PARSERS = Path(os.environ.get("SGLANG_PARSERS_DIR", ROOT / ".cache" / "sglang-parsers"))
CHECKER = ROOT / "tools" / "sglang_argv_check.py"
RELEASES = ["0.4.10.post2", "0.5.4.post3", "0.5.16", "0.5.23"]


def check(version: str, batch: list[list[str]]) -> list[dict[str, Any]]:
    python = PARSERS / f"venv-{version}" / "bin" / "python"
    require(python.exists(), f"the real SGLang {version} parser venv ({python}; `make sglang-parsers` builds it)")
    proc = subprocess.run(
        [str(python), str(CHECKER), "--batch"],
        input=json.dumps(batch),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode in (0, 2), proc.stderr[-2000:]
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    assert all(r.get("version") == version for r in results), results
    return results


def full_config(version: str) -> ServerConfig:
    return ServerConfig(
        model_path="deepseek-ai/DeepSeek-V4-Flash",
        served_model_name="dsv4",
        tp=8,
        dp=2,
        host="0.0.0.0",
        port=31000,
        mem_fraction_static=0.6,
        cuda_graph_bs=(1, 2, 4, 8, 16),
        max_running_requests=48,
        chunked_prefill_size=-1,
        context_length=65536,
        kv_cache_dtype="fp8_e4m3",
        quantization="fp8",
        trust_remote_code=True,
        enable_metrics=True,
        speculative=SpeculativeConfig("EAGLE", 3, 1, 4, "/models/draft"),
        nnodes=2,
        node_rank=1,
        dist_init_addr="node0:5000",
        extra_args=(
            "--log-level",
            "info",
            "--decode-log-interval",
            "40",
            "--skip-server-warmup",
            "--attention-backend",
            "triton",
        ),
    )


@pytest.mark.parametrize("version", RELEASES)
def test_rendered_argv_is_accepted_by_the_real_parser(version: str) -> None:
    configs = [
        config_a(),
        config_b(),
        config_b_fixed(),
        full_config(version),
        config_a().replace(disable_cuda_graph=True),
    ]
    batch = [render_argv(c, version) for c in configs]
    results = check(version, batch)
    for argv, result in zip(batch, results, strict=True):
        assert result["ok"], (argv, result)


def test_the_checker_really_rejects() -> None:
    # The spelling 0.5.23 dropped, and the one 0.5.4 does not have yet: the real parsers say no.
    assert check("0.5.23", [["--model-path", "m", "--cuda-graph-max-bs", "16"]])[0]["error"].startswith(
        "ambiguous option: --cuda-graph-max-bs"
    )
    assert (
        "unrecognized arguments"
        in check("0.5.4.post3", [["--model-path", "m", "--cuda-graph-max-bs-decode", "16"]])[0]["error"]
    )
