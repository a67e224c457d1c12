from __future__ import annotations

import pytest

from dsv4lab.config.hardware import HARDWARE, hardware_profile, model_profile
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.config.versions import resolve_release
from dsv4lab.errors import ConfigError
from dsv4lab.model.memory import capture_batch_sizes, default_mem_fraction_static, preflight, suggest


@pytest.mark.parametrize("version", ["0.5.4", "0.5.23"])
def test_story_outcomes_are_predicted(version: str) -> None:
    a = preflight(config_a(), sglang_version=version)
    b = preflight(config_b(), sglang_version=version)
    fixed = preflight(config_b_fixed(), sglang_version=version)
    assert a.fits and fixed.fits
    assert not b.fits
    assert b.fail_phase == "cuda_graph_capture"
    assert b.failing_gpu is not None and b.failing_gpu.gpu == 1
    assert b.short_by_gib is not None and 17.0 <= b.short_by_gib <= 23.0  # "about 20 GB more"
    assert "short by" in b.explain() and "GPU 1" in b.explain()


def test_split_arithmetic_holds_per_gpu() -> None:
    p = preflight(config_b(), sglang_version="0.5.23")
    f = p.settings.mem_fraction_static
    pre = min(g.free_before_load_gib for g in p.per_gpu)
    for g in p.per_gpu:
        # weights + draft (0.5.23 counts it inside) + KV never exceed f x the least free memory ...
        assert g.weights_gib + g.draft_weights_gib + g.kv_pool_gib == pytest.approx(f * pre, abs=0.02)
        # ... and the slack is whatever this GPU has left, so the least-free GPU has the least slack.
        assert g.slack_gib == pytest.approx(
            g.free_before_load_gib - g.weights_gib - g.draft_weights_gib - g.kv_pool_gib
        )
    assert min(p.per_gpu, key=lambda g: g.slack_gib).gpu == 1
    # KV tokens for the story (reference memory.md §7): about 6.2M without, 4.9M with EAGLE at 0.70.
    assert 5.9e6 < preflight(config_a()).kv_tokens < 6.5e6
    assert 4.6e6 < p.kv_tokens < 5.2e6


def test_graph_runners_follow_speculation() -> None:
    a = preflight(config_a())
    assert [(g.runner, g.tokens_per_request, g.max_bs) for g in a.graphs] == [("decode", 1, 256)]
    b = preflight(config_b())
    assert [(g.runner, g.tokens_per_request) for g in b.graphs] == [("verify", 2), ("draft_extend", 2)]
    deep = preflight(config_b().replace(speculative=SpeculativeConfig("EAGLE", 3, 1, 4)))
    assert [(g.runner, g.tokens_per_request) for g in deep.graphs] == [
        ("verify", 4),
        ("draft_extend", 4),
        ("draft_decode", 1),
    ]
    off = preflight(config_a().replace(disable_cuda_graph=True))
    assert off.graphs == () and off.fits


def test_kv_pool_exhausted_is_its_own_phase() -> None:
    p = preflight(config_a().replace(mem_fraction_static=0.15))
    assert p.fail_phase == "kv_cache_alloc"
    assert p.short_by_gib is not None and p.short_by_gib > 0


def test_weights_that_do_not_fit() -> None:
    p = preflight(config_a().replace(tp=1), hardware="rtx-pro-6000-x8")
    assert p.fail_phase == "weight_loading"


def test_too_many_gpus_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="at most 2 GPUs"):
        preflight(config_a(), hardware="tiny")


def test_suggest_for_the_story() -> None:
    options = suggest(config_b(), concurrency=16, context_len=8192, sglang_version="0.5.23")
    assert options, "Config B needs a fix"
    best = options[0]
    assert dict(best.changes) == {"cuda_graph_max_bs": 16}
    assert best.preflight.fits and best.preflight.min_headroom_gib >= 4.0
    lower = [o for o in options if "mem_fraction_static" in o.changes]
    assert lower and lower[0].changes["mem_fraction_static"] < 0.70
    assert lower[0].preflight.fits
    assert best.as_flags("0.5.23") == "--cuda-graph-max-bs-decode 16"
    # Config B-fixed (the story's fix) also fits with the margin.
    assert preflight(config_b_fixed()).min_headroom_gib > 4.0
    assert suggest(config_a(), concurrency=16) == [] or suggest(config_a(), concurrency=16)[0].preflight.fits


def test_suggest_without_concurrency_takes_the_largest_cap() -> None:
    options = suggest(config_b())
    cap = options[0].changes["cuda_graph_max_bs"]
    assert 16 < cap < 256
    assert options[0].preflight.min_headroom_gib >= 4.0
    bigger = next(s for s in capture_batch_sizes(256, True) if s > cap)
    too_big = preflight(config_b().replace(cuda_graph_max_bs=bigger))
    assert not too_big.fits or too_big.min_headroom_gib < 4.0


def test_defaults_follow_sglang_heuristic() -> None:
    gpu = hardware_profile("rtx-pro-6000-x8").gpu.total_gib
    # Reference memory.md §4.2: TP8 default about 0.848, with EAGLE (0.5.4-era) about 0.827.
    assert default_mem_fraction_static(gpu, 8, 8192, 512, False, resolve_release("0.5.4")) == pytest.approx(
        0.848, abs=0.005
    )
    assert default_mem_fraction_static(gpu, 8, 8192, 512, True, resolve_release("0.5.4")) == pytest.approx(
        0.827, abs=0.005
    )
    p = preflight(ServerConfig(model_path="deepseek-ai/DeepSeek-V4-Flash", tp=8))
    assert p.settings.mem_fraction_is_default
    assert "heuristic" in p.explain()


def test_capture_sizes() -> None:
    assert capture_batch_sizes(16, False) == (1, 2, 4, 8, 12, 16)
    assert capture_batch_sizes(16, True)[:10] == (1, 2, 3, 4, 5, 6, 7, 8, 10, 12)
    assert capture_batch_sizes(20, False)[-1] == 20


def test_profiles() -> None:
    assert set(HARDWARE) >= {"rtx-pro-6000-x8", "h200-x8", "tiny"}
    assert model_profile("/models/DeepSeek-V4-Flash").name == "deepseek-v4-flash"
    with pytest.raises(ConfigError, match="hardware"):
        hardware_profile("a100")
    with pytest.raises(ConfigError, match="known model"):
        model_profile("meta-llama/Llama-3-8B")
    h = hardware_profile("rtx-pro-6000-x8")
    assert h.gpu_name_as_file() == "NVIDIA_RTX_PRO_6000_Blackwell_Server_Edition"
    assert len(h.free_before_load_gib()) == h.count


def test_preflight_reports() -> None:
    p = preflight(config_b())
    d = p.to_dict()
    assert d["fits"] is False and d["fail_phase"] == "cuda_graph_capture" and d["failing_gpu"] == 1
    assert len(d["per_gpu"]) == 8
    assert "OOM in cuda_graph_capture" in p._repr_html_()
