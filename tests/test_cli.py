from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dsv4lab.cli.main import main
from dsv4lab.config.presets import config_b_fixed
from dsv4lab.config.server_config import ServerConfig, save


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_render_story_script_for_0_5_23() -> None:
    proc = run_cli("config", "render", "--preset", "config_b", "--sglang-version", "0.5.23")
    assert proc.returncode == 0, proc.stderr
    assert "--speculative-num-draft-tokens 2" in proc.stdout
    check = subprocess.run(["bash", "-n"], input=proc.stdout, text=True, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stderr


def test_render_argv_with_set_and_version_note() -> None:
    proc = run_cli(
        "config",
        "render",
        "--preset",
        "config_b",
        "--set",
        "mem_fraction_static=0.6",
        "--set",
        "cuda_graph_max_bs=16",
        "--sglang-version",
        "0.5.10",
        "--what",
        "argv",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("python3 -m sglang.launch_server --model-path deepseek-ai/DeepSeek-V4-Flash")
    assert "--cuda-graph-max-bs 16" in proc.stdout and "--mem-fraction-static 0.6" in proc.stdout
    assert "Note: SGLang 0.5.10 is not a release dsv4lab knows" in proc.stderr


def test_bad_value_prints_one_error_line_and_exits_2() -> None:
    proc = run_cli("config", "show", "--set", "mem_fraction_static=1.5")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "Error: mem_fraction_static=1.5 is not valid: a number strictly between 0 and 1, or unset"
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_unsupported_flag_exits_2() -> None:
    proc = run_cli("config", "render", "--set", "kv_cache_dtype=mxfp8", "--sglang-version", "0.5.4")
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error: SGLang 0.5.4 has no launch flag for kv_cache_dtype")


def test_usage_errors_exit_2() -> None:
    assert run_cli("config", "render", "--preset", "nope").returncode == 2
    assert run_cli("config", "show", "--set", "novalue").returncode == 2
    assert run_cli().returncode == 2


def test_show_round_trips_through_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(config_b_fixed(), tmp_path / "fixed.toml")
    assert main(["config", "show", "--file", str(path), "--format", "json"]) == 0
    shown = ServerConfig.from_dict(json.loads(capsys.readouterr().out))
    assert shown == config_b_fixed()
    assert main(["config", "show", "--preset", "config_a", "--format", "table"]) == 0
    assert "mem_fraction_static" in capsys.readouterr().out


def test_diff_presets_and_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = save(config_b_fixed(), tmp_path / "fixed.json")
    assert main(["config", "diff", "config_b", str(path)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mem_fraction_static: 0.7 -> 0.6",
        "cuda_graph_max_bs: (unset) -> 16",
    ]
    assert main(["config", "diff", "config_b", "other"]) == 2
    assert "(allowed: config_a, config_b, config_b_fixed; or a .toml/.json file)" in capsys.readouterr().err


def test_fields_lists_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "fields"]) == 0
    out = capsys.readouterr().out
    assert "speculative.num_draft_tokens" in out and "mem_fraction_static" in out


def test_preflight_json_contract() -> None:
    proc = run_cli("preflight", "--preset", "config_b", "--json", "--concurrency", "16")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fits"] is False
    assert out["fail_phase"] == "cuda_graph_capture"
    assert 17 < out["short_by_gib"] < 23
    assert len(out["per_gpu"]) == 8
    assert out["suggestion"]["changes"] == {"cuda_graph_max_bs": 16}


def test_preflight_set_and_hardware() -> None:
    proc = run_cli(
        "preflight",
        "--preset",
        "config_b",
        "--set",
        "mem_fraction_static=0.6",
        "--set",
        "cuda_graph_max_bs=16",
        "--hardware",
        "rtx-pro-6000-x8",
        "--json",
    )
    out = json.loads(proc.stdout)
    assert out["fits"] is True and out["fail_phase"] is None and out["short_by_gib"] is None
    assert out["suggestion"] is None
    human = run_cli("preflight", "--preset", "config_b")
    assert "Predicted: OOM in cuda_graph_capture on GPU 1" in human.stdout
    assert "Suggested: --cuda-graph-max-bs-decode" in human.stdout
    bad = run_cli("preflight", "--preset", "config_a", "--hardware", "a100")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "Error: unknown hardware profile 'a100' (allowed: rtx-pro-6000-x8, h200-x8, tiny)"


#: tools/make_tiny_model.py's config.json: 2 layers of 4 KV heads of 32, float32, 2,048 positions.
TINY_CONFIG = {
    "model_type": "llama", "dtype": "float32", "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "head_dim": 32, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 3000,
    "max_position_embeddings": 2048,
}  # fmt: skip


def _tiny_model(tmp_path: Path) -> Path:
    folder = tmp_path / "tiny-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_CONFIG))
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    return folder


def test_vllm_preflight_json_contract_on_this_hosts_memory(tmp_path: Path) -> None:
    model = _tiny_model(tmp_path)
    base = ("preflight", "--engine", "vllm", "--set", f"model_path={model}", "--set", "dtype=float32")
    # A KV space no host has: the KV cache allocation fails, short by about the space itself.
    proc = run_cli(*base, "--set", "env.VLLM_CPU_KVCACHE_SPACE=100000", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["fail_phase"] == "kv_cache_alloc"
    assert 100000 - out["host_memory"]["available_gib"] < out["short_by_gib"] < 100000
    assert out["field"] == "env.VLLM_CPU_KVCACHE_SPACE" and "VLLM_CPU_KVCACHE_SPACE=" in out["fix"]
    assert "100000.00 GiB" in out["reason"] and out["backend"] == "cpu"
    # 1 GiB for 600,000 tokens: vLLM's "max seq len" refusal, its own estimate of the longest that fits.
    short = json.loads(run_cli(*base, "--set", "env.VLLM_CPU_KVCACHE_SPACE=1", "--set", "max_model_len=600000",
                               "--json").stdout)  # fmt: skip
    assert short["fail_phase"] == "kv_cache_alloc" and short["field"] == "max_model_len"
    assert short["kv"]["estimated_max_model_len"] == 524160 and "max_model_len=524160" in short["fix"]
    # The same for a GPU profile: the split as vLLM logs it.
    gpu = json.loads(run_cli(*base, "--hardware", "tiny", "--json").stdout)
    assert gpu["fits"] is True and gpu["backend"] == "gpu" and gpu["split"][0]["device"] == "GPU 0"
    human = run_cli(*base, "--set", "env.VLLM_CPU_KVCACHE_SPACE=100000")
    assert "Predicted: fails in kv_cache_alloc" in human.stdout and "Fix: VLLM_CPU_KVCACHE_SPACE=" in human.stdout


def test_vllm_preflight_refuses_sglang_options() -> None:
    base = ("preflight", "--engine", "vllm", "--set", "model_path=/nowhere")
    bad = run_cli(*base, "--model", "deepseek-v4-flash")
    assert bad.returncode == 2 and "--model" in bad.stderr
    both = run_cli(*base, "--hardware", "tiny", "--host", "gpubox")
    assert both.returncode == 2 and "not both" in both.stderr
    sglang = run_cli("preflight", "--preset", "config_a", "--host", "gpubox")
    assert sglang.returncode == 2 and "only with --engine vllm" in sglang.stderr
