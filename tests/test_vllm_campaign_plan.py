"""The real-engine campaign before anything runs: its fixes, its notebooks' parameters, its arms and charts.

No server here (``tests/test_vllm_campaign.py`` runs the campaign against a real vLLM): what a user gets
wrong, and what the memory model decides, is known before a kernel or a server starts.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dsv4lab.config import ServerConfig, VllmConfig, diff
from dsv4lab.engines import get_engine
from dsv4lab.errors import ConfigError, UnknownNameError
from dsv4lab.model.vllm_fixes import choose_vllm_fix, vllm_fix_candidates
from dsv4lab.model.vllm_memory import GIB, HostMemory, ModelFacts, vllm_preflight
from dsv4lab.notebook.campaign import check_campaign, load_campaign
from dsv4lab.notebook.experiment import Experiment, check_experiment_parameters
from dsv4lab.notebook.lab import _check_change_names, _compare_plan
from dsv4lab.notebook.nbrun import check_parameters
from dsv4lab.resources import CAMPAIGNS, CONFIGS

#: The tiny Llama the real-engine tests serve (tools/make_tiny_model.py): 2 layers, 4 KV heads of 32.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "torch_dtype": "float32",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
    "vocab_size": 3000,
}
HOST = HostMemory("local", 23 * GIB, 21 * GIB)


def _model() -> ModelFacts:
    return ModelFacts.from_config_json(TINY, 4_387_504, name="tiny")


def _long(**env: str) -> VllmConfig:
    base = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", **env}
    return VllmConfig(model_path="/m", dtype="float32", max_model_len=600_000, env=base)


def test_a_context_too_long_for_the_kv_space_has_two_fixes_and_the_one_that_keeps_it_is_chosen() -> None:
    predicted = vllm_preflight(_long(), HOST, model=_model(), model_from_path=False)
    assert not predicted.fits and predicted.fail_phase == "kv_cache_alloc"
    candidates = vllm_fix_candidates(predicted)
    by_flags = {c.flags: c for c in candidates}
    # 1 GiB of float32 KV: 4,096 blocks of 128 tokens, one is the null block -> vLLM's estimate 524,160.
    assert set(by_flags) == {"env.VLLM_CPU_KVCACHE_SPACE=2", "max_model_len=524160"}
    assert all(c.fits for c in candidates), [c.to_dict() for c in candidates]
    chosen = choose_vllm_fix(candidates)
    assert chosen.flags == "env.VLLM_CPU_KVCACHE_SPACE=2" and chosen.keeps_max_model_len
    # Each candidate is the prediction for the changed config, not a guess: the other one cuts the context.
    cut = by_flags["max_model_len=524160"]
    assert cut.prediction.kv is not None and cut.prediction.kv.max_model_len == 524_160
    assert math.isclose(chosen.headroom_gib, cut.headroom_gib - 1.0, abs_tol=1e-3)  # one more GiB of KV
    assert "fits" in chosen.prediction.explain()
    assert "keeps max_model_len" in candidates._repr_html_()


def test_a_kv_space_above_the_host_is_fixed_by_what_the_host_has_left() -> None:
    config = VllmConfig(model_path="/m", dtype="float32", max_model_len=1024, env={"VLLM_CPU_KVCACHE_SPACE": "90"})
    predicted = vllm_preflight(config, HOST, model=_model(), model_from_path=False)
    [fix] = vllm_fix_candidates(predicted)
    assert fix.fits and fix.changes == {"env.VLLM_CPU_KVCACHE_SPACE": "19"}
    assert 0 < fix.headroom_gib < 1.0


def test_no_fix_that_fits_is_an_error_that_says_so() -> None:
    tiny_host = HostMemory("small", 2 * GIB, int(1.6 * GIB))
    predicted = vllm_preflight(_long(), tiny_host, model=_model(), model_from_path=False)
    candidates = vllm_fix_candidates(predicted)
    assert not any(c.fits for c in candidates)
    with pytest.raises(ConfigError, match="none of vLLM's options does on this host"):
        choose_vllm_fix(candidates)
    assert len(vllm_fix_candidates(vllm_preflight(_long(VLLM_CPU_KVCACHE_SPACE="2"), HOST, model=_model()))) == 0


def test_the_shipped_cpu_config_is_found_by_name_and_takes_the_notebooks_model(tmp_path: Path) -> None:
    assert (CONFIGS / "vllm-cpu.toml").is_file()
    ex = Experiment(target="vllm", preset="vllm-cpu.toml", model_path=str(tmp_path), run_dir=str(tmp_path / "r"))
    config = ex.config(max_model_len=600_000)
    assert isinstance(config, VllmConfig)
    assert (config.model_path, config.max_model_len, config.enforce_eager) == (str(tmp_path), 600_000, True)
    assert config.env["VLLM_CPU_KVCACHE_SPACE"] == "1" and ex.engine_version is None
    # Without a file, the config starts from model_path; without either, the error names model_path.
    plain = Experiment(target="vllm", preset="", model_path="/m").config(max_num_seqs="4")
    assert plain == VllmConfig(model_path="/m", max_num_seqs=4)
    with pytest.raises(ConfigError, match="parameter model_path"):
        Experiment(target="vllm", preset="").config()
    with pytest.raises(ConfigError, match=r"vllm-cpu\.toml"):
        Experiment(target="vllm", preset="no-such.toml", model_path="/m").config()


@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"model_path": ""}, r"parameter model_path of 11_vllm_baseline"),
        ({"overrides": "max_num_seq=4"}, r"parameter overrides of 11_vllm_baseline.*max_num_seq"),
        ({"version": "0.99.0"}, r"parameter version of 11_vllm_baseline.*0\.99\.0"),
        ({"preset": "config_a"}, r"parameter preset of 11_vllm_baseline"),
        ({"target": "vlm"}, r"'vlm'.*vllm"),
    ],
    ids=["no model", "unknown field", "unknown release", "an SGLang preset", "unknown engine"],
)
def test_the_vllm_notebooks_refuse_bad_parameters_before_a_kernel_starts(
    params: dict[str, Any], names: str, tmp_path: Path
) -> None:
    with pytest.raises((ConfigError, UnknownNameError), match=names):
        check_parameters("11_vllm_baseline", {"model_path": str(tmp_path), **params})


def test_the_lever_is_checked_as_a_config_change(tmp_path: Path) -> None:
    ok = {"model_path": str(tmp_path), "lever": "max_num_seqs", "lever_value": "1"}
    check_parameters("13_vllm_fix_and_lever", ok)
    with pytest.raises(ConfigError, match=r"parameter lever of 13_vllm_fix_and_lever.*max_num_seq"):
        check_parameters("13_vllm_fix_and_lever", {**ok, "lever": "max_num_seq"})
    with pytest.raises(ConfigError, match=r"parameter lever of 13_vllm_fix_and_lever.*max_num_seqs='many'"):
        check_parameters("13_vllm_fix_and_lever", {**ok, "lever_value": "many"})
    # The story's notebooks, which declare no lever, are checked as before.
    check_experiment_parameters({"preset": "config_b", "fix": "mem_fraction_static=0.6"}, notebook="04")


def test_the_campaign_file_names_what_it_needs(tmp_path: Path) -> None:
    campaign = load_campaign(CAMPAIGNS / "vllm-cpu.toml")
    assert [Path(s.notebook).stem for s in campaign.steps] == [
        "11_vllm_baseline",
        "12_vllm_memory_failure",
        "13_vllm_fix_and_lever",
    ]
    with pytest.raises(ConfigError, match=r"step baseline: parameter model_path"):
        check_campaign(campaign)
    check_campaign(campaign.with_parameters({"model_path": str(tmp_path), "python": "/venv/bin/python"}))


def test_a_vllm_comparison_is_planned_with_vllms_fields() -> None:
    engine = get_engine("vllm")
    fixed = VllmConfig(model_path="/m", env={"VLLM_CPU_KVCACHE_SPACE": "2"})
    a, b, names = _compare_plan(
        engine, fixed, None, ("fixed", "fixed, max_num_seqs=1"), None, {"max_num_seqs": "1"}, {}
    )
    assert isinstance(b, VllmConfig) and b.max_num_seqs == 1 and a == fixed
    assert [c.field for c in diff(a, b)] == ["max_num_seqs"]
    assert names == ("fixed", "fixed, max_num_seqs=1")
    with pytest.raises(ConfigError, match=r"max_num_seq.*max_num_seqs"):
        _check_change_names({"max_num_seq": 1}, engine.field_names())
    with pytest.raises(ConfigError, match="differs from A"):
        _compare_plan(engine, fixed, fixed, None, None, None, {})
    with pytest.raises(ConfigError, match="same type"):
        diff(ServerConfig(model_path="/m"), fixed)


def test_a_host_memory_chart_says_host_memory_not_gpu() -> None:
    from dsv4lab import plots

    times = pd.date_range("2026-12-02 00:00:00", periods=20, freq="500ms", tz="UTC")
    samples = pd.DataFrame(
        {
            "time": times,
            "t": [i * 0.5 for i in range(20)],
            "gpu": 0,
            "used_mib": [i * 150.0 for i in range(20)],
            "total_mib": 23 * 1024.0,
            "util_pct": float("nan"),
        }
    )
    samples.attrs.update(memory_of="host", interval_ms=500)
    refs = [(21.0, "available at launch 21.0 GiB"), (2.6, "predicted 2.6 GiB: processes + weights + KV space 1.0")]
    spec = plots.to_spec(plots.memory_timeline(samples, config="baseline", references=refs))
    text = repr(spec)
    assert "GPU memory" not in text and "nvidia-smi" not in text
    assert "resident memory of the server's processes (GiB)" in text and "host memory (MemTotal) 23.0 GiB" in text
    assert "baseline: peak 2.8 of 23.0 GiB of host memory" in text and "available at launch 21.0 GiB" in text
    assert "node 0" in text
