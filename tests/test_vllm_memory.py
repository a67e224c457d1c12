"""vLLM's memory model (dsv4lab.model.vllm_memory): every figure below is worked by hand in the comments.

The CPU checks are vLLM's own arithmetic (KV space against the memory node, KV blocks against one
max_model_len request); the GPU split is a documented estimate whose terms are checked one by one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dsv4lab.config.vllm_config import VllmConfig
from dsv4lab.errors import ConfigError
from dsv4lab.model.vllm_memory import (
    CPU_PROCESS_MEMORY_GIB,
    GpuEstimates,
    HostMemory,
    KvCapacity,
    ModelFacts,
    kv_capacity,
    vllm_preflight,
)

GIB = 1024**3

#: tools/make_tiny_model.py's config.json (transformers 5 writes "dtype", not "torch_dtype").
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "dtype": "float32",
    "head_dim": 32,
    "hidden_size": 128,
    "intermediate_size": 256,
    "max_position_embeddings": 2048,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "vocab_size": 3000,
}
TINY_BYTES = 4_387_504  # its model.safetensors

#: A Llama-3-8B-shaped model for the GPU split: 32 layers, 8 KV heads of 128, 16 GiB of bfloat16 weights.
LLAMA = {
    "model_type": "llama",
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


def _kib(n: float) -> str:
    return f"{round(n * 1024 * 1024)} kB"


def _host(
    *, total_gib: float = 16, free_gib: float = 8, file_gib: float = 1, slab_gib: float = 0.5, **kw: object
) -> HostMemory:
    """A host whose node 0 has ``free + 2 x file + slab`` GiB available (10.5 GiB by default)."""
    node = "\n".join(
        f"Node 0 {k}: {_kib(v)}"
        for k, v in {
            "MemTotal": total_gib,
            "MemFree": free_gib,
            "Active(file)": file_gib,
            "Inactive(file)": file_gib,
            "SReclaimable": slab_gib,
        }.items()
    )
    meminfo = f"MemTotal: {_kib(total_gib + 8)}\nMemFree: {_kib(free_gib)}\nMemAvailable: {_kib(free_gib + 4)}\n"
    return HostMemory.from_meminfo("box", meminfo, node_meminfo=node, node=0, **kw)  # type: ignore[arg-type]


def _tiny() -> ModelFacts:
    return ModelFacts.from_config_json(TINY, TINY_BYTES, name="tiny")


def _cpu_config(**kw: object) -> VllmConfig:
    return VllmConfig(model_path="/nowhere/tiny", dtype="float32", **kw)  # type: ignore[arg-type]


# -- the host's memory ------------------------------------------------------------------------------------


def test_host_memory_is_what_vllms_cpu_worker_reads() -> None:
    mem = _host()
    # node 0: MemFree 8 + Active(file) 1 + Inactive(file) 1 + SReclaimable 0.5 = 10.5 GiB, total 16 GiB;
    # /proc/meminfo's MemAvailable (12 GiB here) is only kept for comparison.
    assert mem.available_gib == pytest.approx(10.5)
    assert mem.total_gib == pytest.approx(16)
    assert mem.mem_available_bytes == 12 * GIB
    assert mem.where == "node 0 of box"


def test_a_cgroup_limit_below_the_node_caps_total_and_available() -> None:
    # limit 8 GiB, usage 6 GiB: total 8, available min(10.5, 8 - 6) = 2 GiB.
    mem = _host(cgroup_limit=8 * GIB, cgroup_usage=6 * GIB)
    assert mem.total_gib == pytest.approx(8) and mem.available_gib == pytest.approx(2)
    # A limit above the node's total changes nothing.
    assert _host(cgroup_limit=64 * GIB, cgroup_usage=60 * GIB).available_gib == pytest.approx(10.5)


def test_without_node_files_it_is_memtotal_and_memavailable() -> None:
    mem = HostMemory.from_meminfo("box", "MemTotal: 2097152 kB\nMemFree: 524288 kB\nMemAvailable: 1048576 kB\n")
    assert (mem.node, mem.total_gib, mem.available_gib) == (None, 2.0, 1.0)
    with pytest.raises(ConfigError, match="meminfo"):
        HostMemory.from_meminfo("box", "no such lines")


# -- the model's facts ------------------------------------------------------------------------------------


def test_model_facts_from_config_json() -> None:
    m = _tiny()
    assert (m.layers, m.kv_heads, m.head_dim, m.max_position_embeddings, m.dtype) == (2, 4, 32, 2048, "float32")
    # No num_key_value_heads: every head is a KV head; no head_dim: hidden / heads.
    plain = ModelFacts.from_config_json(
        {k: v for k, v in TINY.items() if k not in ("num_key_value_heads", "head_dim")}, 0
    )
    assert (plain.kv_heads, plain.head_dim) == (4, 128 // 4)
    # A multimodal config keeps its LLM under text_config.
    vl = ModelFacts.from_config_json({"model_type": "llava", "text_config": LLAMA}, 0)
    assert (vl.layers, vl.kv_heads, vl.head_dim) == (32, 8, 4096 // 32)
    # model_max_length wins over the other length keys, as vLLM reads it.
    assert ModelFacts.from_config_json({**TINY, "model_max_length": 512}, 0).max_position_embeddings == 512
    mla = ModelFacts.from_config_json({**LLAMA, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, 0)
    assert mla.mla_latent == 576
    assert ModelFacts.from_config_json({**LLAMA, "compress_ratios": [0, 4]}, 0).unmodelled
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        ModelFacts.from_config_json({**TINY, "num_hidden_layers": 0}, 0)


def test_model_facts_from_a_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "model-00001.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002.safetensors").write_bytes(b"x" * 24)
    m = ModelFacts.from_folder(tmp_path)
    assert m.weight_bytes == 1024 and m.name == tmp_path.name
    with pytest.raises(ConfigError, match=r"config\.json"):
        ModelFacts.from_folder(tmp_path / "missing")


def test_served_dtype_and_weights_follow_vllms_rules() -> None:
    m = _tiny()
    # dtype auto: a float32 checkpoint is served as bfloat16, and its weights take half the file's size.
    assert m.served_dtype(None) == "bfloat16" and m.served_dtype("auto") == "bfloat16"
    assert m.served_dtype("auto", bf16=False) == "float16"
    assert m.weights_in_memory("bfloat16") == TINY_BYTES // 2
    assert m.served_dtype("float32") == "float32" and m.weights_in_memory("float32") == TINY_BYTES


# -- KV capacity ---------------------------------------------------------------------------------------------


def test_kv_capacity_by_hand() -> None:
    # A block: 2 layers x 128 tokens x 4 KV heads x (K + V) x 32 x 4 B = 262,144 B (2,048 B per token).
    kv = kv_capacity(_tiny(), 1 * GIB, 1024, block_size=128, kv_dtype_bytes=4)
    assert kv.bytes_per_block == 262_144 and kv.bytes_per_token == 2048
    # 1 GiB / 262,144 = 4,096 blocks; 1,024 tokens = 8 blocks, so 512 requests: vLLM logs 524,288 tokens.
    assert (kv.num_blocks, kv.max_concurrency, kv.tokens) == (4096, 512.0, 524_288)
    assert kv.fits
    # tp=2 halves the KV heads of each worker, pp=2 the layers: a quarter of the block.
    assert kv_capacity(_tiny(), GIB, 1024, block_size=128, kv_dtype_bytes=4, tensor_parallel_size=2,
                       pipeline_parallel_size=2).bytes_per_block == 262_144 // 4  # fmt: skip
    # MLA: one 576-wide latent per token and layer: 16 x 576 x 2 B x 32 layers per block.
    mla = ModelFacts.from_config_json({**LLAMA, "kv_lora_rank": 512, "qk_rope_head_dim": 64}, 0)
    assert kv_capacity(mla, GIB, 1024, block_size=16, kv_dtype_bytes=2).bytes_per_block == 16 * 576 * 2 * 32


def test_kv_capacity_too_small_for_max_model_len_matches_vllms_message() -> None:
    kv = kv_capacity(_tiny(), 1 * GIB, 600_000, block_size=128, kv_dtype_bytes=4)
    # One request: ceil(600,000 / 128) = 4,688 blocks x 262,144 B = 1,228,931,072 B = 1.14 GiB, more than
    # the usable 1 GiB - one null block = 1,073,479,680 B.
    assert kv.needed_bytes == 1_228_931_072 and kv.usable_bytes == 1_073_479_680
    assert not kv.fits
    # vLLM: "the estimated maximum model length is 524160" = 4,095 usable blocks x 128.
    assert kv.estimated_max_model_len == 524_160
    # The space that serves it: 4,688 blocks + the null block = 1,229,193,216 B (2 GiB in whole GiB).
    assert kv.bytes_for_max_model_len == 1_229_193_216
    # One block of cache is no cache: vLLM's "No available memory for the cache blocks".
    none = KvCapacity(262_144, 128, 262_144, 1024)
    assert not none.fits and none.estimated_max_model_len == 0


# -- the CPU preflight --------------------------------------------------------------------------------------


def test_cpu_kv_space_above_the_nodes_memory_fails_at_the_kv_allocation() -> None:
    p = vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "64"}), _host(), model=_tiny())
    # Available when the cache is allocated: 10.5 - 1.5 (vLLM's processes) - 4,387,504 B of float32 weights
    # = 8.995914 GiB; 64 GiB asked -> short by 55.004086 GiB.
    weights = TINY_BYTES / GIB
    assert not p.fits and p.fail_phase == "kv_cache_alloc"
    assert p.short_by_gib == pytest.approx(64 - (10.5 - CPU_PROCESS_MEMORY_GIB - weights))
    assert p.fix_field == "env.VLLM_CPU_KVCACHE_SPACE" and p.kv_source == "VLLM_CPU_KVCACHE_SPACE"
    assert p.fix is not None and p.fix.startswith("VLLM_CPU_KVCACHE_SPACE=8 ")  # floor(8.996)
    assert p.reason is not None and "64.00 GiB" in p.reason and "10.50 of 16.00 GiB" in p.reason
    error = p.refusal()
    assert isinstance(error, ConfigError) and error.field == "env.VLLM_CPU_KVCACHE_SPACE" and error.value == "64"
    assert "VLLM_CPU_KVCACHE_SPACE=8" in str(error) and "short by 55.00 GiB" in str(error)
    # 8 GiB fits, and so does kv_cache_memory_bytes below what is left.
    assert vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "8"}), _host(), model=_tiny()).fits
    bytes_ = vllm_preflight(_cpu_config(kv_cache_memory_bytes=9 * GIB), _host(), model=_tiny())
    assert bytes_.fail_phase == "kv_cache_alloc" and bytes_.fix_field == "kv_cache_memory_bytes"


def test_cpu_kv_space_too_small_for_max_model_len() -> None:
    config = _cpu_config(max_model_len=600_000, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    p = vllm_preflight(config, _host(), model=_tiny())
    assert not p.fits and p.fail_phase == "kv_cache_alloc"
    # (1,229,193,216 - 1 GiB) / GiB = 0.14478 GiB short; the fix names the estimate and the whole GiB that serve.
    assert p.short_by_gib == pytest.approx((1_229_193_216 - GIB) / GIB)
    assert p.reason is not None and "max seq len (600000)" in p.reason and "(1.14 GiB" in p.reason
    assert "(1.00 GiB)" in p.reason and "524160" in p.reason
    assert p.fix == (
        "max_model_len=524160 (the longest that fits), or VLLM_CPU_KVCACHE_SPACE=2 (the space that serves "
        "max_model_len 600,000)"
    )
    assert p.fix_field == "max_model_len"
    assert any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in n for n in p.notes)  # 600,000 > the model's 2,048
    allowed = config.replace(env={**config.env, "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"})
    assert not any("VLLM_ALLOW_LONG" in n for n in vllm_preflight(allowed, _host(), model=_tiny()).notes)
    # Unset max_model_len: the model's 2,048 tokens, 16 blocks: fits.
    assert vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), _host(), model=_tiny()).fits
    # A zero KV space: no block at all.
    zero = vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "0"}), _host(), model=_tiny())
    assert zero.fail_phase == "kv_cache_alloc" and zero.reason is not None and "No available memory" in zero.reason


def test_cpu_without_kv_space_reserves_the_utilization_share_at_startup() -> None:
    p = vllm_preflight(_cpu_config(), _host(), model=_tiny())
    # ceil(16 GiB x 0.92) = 14.72 GiB against 10.5 - 1.5 = 9.0 GiB: short by 5.72 at worker start.
    assert p.fail_phase == "startup_other" and p.short_by_gib == pytest.approx(14.72 - 9.0)
    assert p.fix is not None and "gpu_memory_utilization=0.55" in p.fix  # floor((9 / 16 - 0.01) x 100) / 100
    # At 0.5: 8 GiB reserved, minus the worker's 0.7 GiB and the weights, is the cache: fits.
    half = vllm_preflight(_cpu_config(gpu_memory_utilization=0.5), _host(), model=_tiny())
    assert half.fits and half.split[0].kv_cache_gib == pytest.approx(8 - 0.7 - TINY_BYTES / GIB)
    # A KV space the host's own environment sets counts, and the config's env wins over it.
    inherited = vllm_preflight(_cpu_config(), _host(env={"VLLM_CPU_KVCACHE_SPACE": "2"}), model=_tiny())
    assert inherited.fits and inherited.split[0].requested_gib == 2
    config = _cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "64"})
    assert not vllm_preflight(config, _host(env={"VLLM_CPU_KVCACHE_SPACE": "2"}), model=_tiny()).fits


def test_cpu_kv_space_must_be_whole_gib() -> None:
    with pytest.raises(ConfigError, match=r"VLLM_CPU_KVCACHE_SPACE='1\.5' is not valid: a whole number of GiB"):
        vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "1.5"}), _host(), model=_tiny())


def test_cpu_without_model_facts_checks_only_the_space() -> None:
    p = vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "1"}), _host())
    assert p.fits and p.kv is None and p.model is None
    assert any("max_model_len check did not run" in n for n in p.notes)


def test_the_model_folder_is_read_when_model_path_is_local(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    config = VllmConfig(model_path=str(tmp_path), max_model_len=600_000, env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert vllm_preflight(config, _host()).model is not None
    assert vllm_preflight(config, _host(), model_from_path=False).model is None
    with pytest.raises(ConfigError, match="host_memory"):
        vllm_preflight(config)


def test_to_dict_and_html() -> None:
    p = vllm_preflight(_cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "64"}), _host(), model=_tiny())
    d = json.loads(json.dumps(p.to_dict()))
    assert d["fits"] is False and d["fail_phase"] == "kv_cache_alloc" and d["short_by_gib"] == pytest.approx(55.004)
    assert d["reason"] == p.reason and d["fix"] == p.fix and d["host_memory"]["available_gib"] == 10.5
    assert d["kv"]["block_size"] == 128 and d["split"][0]["device"] == "node 0 of box"
    html = p._repr_html_()
    assert "vLLM memory preflight" in html and "kv_cache_alloc" in html


# -- the GPU split -------------------------------------------------------------------------------------------


def _llama() -> ModelFacts:
    return ModelFacts.from_config_json(LLAMA, 16 * GIB, name="llama")


#: The tiny profile's GPU: 24 GiB, 0.5 GiB context, GPU 1 with 0.1 GiB used by others -> 23.5 / 23.4 GiB free.
#: Under 70 GiB vLLM schedules 2,048 tokens and 256 sequences by default. Peak activation:
#: 2,048 x 2 B x (4 x 4,096 + 2 x 14,336) = 184,549,376 B, plus the sampler's 256 x 128,256 x 4 B x 3 =
#: 394,002,432 B: 578,551,808 B = 0.538818 GiB.
ACTIVATION_GIB = 578_551_808 / GIB


def test_gpu_split_by_hand() -> None:
    config = VllmConfig(model_path="llama", gpu_memory_utilization=0.9, enforce_eager=True)
    p = vllm_preflight(config, hardware="tiny", model=_llama())
    g0 = p.split[0]
    assert p.backend == "gpu" and p.fits and len(p.split) == 1
    assert (g0.total_gib, g0.free_gib) == (24.0, 23.5) and g0.requested_gib == pytest.approx(21.6)
    assert g0.weights_gib == 16 and g0.activation_gib == pytest.approx(ACTIVATION_GIB)
    assert (g0.non_torch_gib, g0.cuda_graph_gib) == (0.5, 0.0)  # eager: no graphs
    # KV = 21.6 - 16 - 0.538818 - 0.5 = 4.561182 GiB.
    assert g0.kv_cache_gib == pytest.approx(21.6 - 16 - ACTIVATION_GIB - 0.5)
    # A block: 32 layers x 16 tokens x 8 KV heads x 2 x 128 x 2 B = 2 MiB; 4.561182 GiB / 2 MiB = 2,335 blocks.
    assert p.kv is not None and p.kv.bytes_per_block == 2 * 1024**2 and p.kv.num_blocks == 2335


def test_gpu_cuda_graph_pool_comes_out_of_the_kv_cache() -> None:
    config = VllmConfig(model_path="llama", gpu_memory_utilization=0.9)
    p = vllm_preflight(config, hardware="tiny", model=_llama())
    # Capture sizes up to min(2 x 256, 512) = 512: 1, 2, 4 + 8..248 by 8 (31) + 256..512 by 16 (17) = 51;
    # 51 sizes x 32 layers x (2.51 GiB / 51 / 43 layers) = 32 x 2.51 / 43 = 1.867907 GiB.
    graphs = 32 * 2.51 / 43
    assert p.split[0].cuda_graph_gib == pytest.approx(graphs)
    assert p.split[0].kv_cache_gib == pytest.approx(21.6 - 16 - ACTIVATION_GIB - 0.5 - graphs)
    # vLLM 0.11 does not subtract the graphs before sizing the KV cache.
    old = vllm_preflight(config, hardware="tiny", model=_llama(), vllm_version="0.11.0")
    assert old.split[0].kv_cache_gib == pytest.approx(21.6 - 16 - ACTIVATION_GIB - 0.5)
    # The estimates are parameters: a calibrated activation figure changes the KV cache by as much.
    zero = vllm_preflight(config, hardware="tiny", model=_llama(), estimates=GpuEstimates(non_torch_gib=0.0))
    assert zero.split[0].kv_cache_gib - p.split[0].kv_cache_gib == pytest.approx(0.5)


def test_gpu_negative_kv_cache_is_a_failure_at_kv_sizing() -> None:
    p = vllm_preflight(VllmConfig(model_path="llama", gpu_memory_utilization=0.7, enforce_eager=True),
                       hardware="tiny", model=_llama())  # fmt: skip
    # 0.7 x 24 = 16.8 GiB requested, 16 + 0.538818 + 0.5 needed before the cache: short by 0.238818 GiB.
    assert p.fail_phase == "kv_cache_alloc" and p.short_by_gib == pytest.approx(16 + ACTIVATION_GIB + 0.5 - 16.8)
    assert p.reason is not None and "No available memory for the cache blocks" in p.reason
    assert p.fix_field == "gpu_memory_utilization"


def test_gpu_utilization_above_free_memory_fails_at_startup_on_the_fullest_gpu() -> None:
    p = vllm_preflight(VllmConfig(model_path="llama", gpu_memory_utilization=0.99, tensor_parallel_size=2),
                       hardware="tiny", model=_llama())  # fmt: skip
    # 0.99 x 24 = 23.76 GiB against 23.5 (GPU 0) and 23.4 (GPU 1) free: GPU 1 is short by more, 0.36 GiB.
    assert p.fail_phase == "startup_other" and p.short_by_gib == pytest.approx(0.36)
    assert [d.fail_phase for d in p.split] == ["startup_other", "startup_other"]
    assert p.split[1].weights_gib == 8  # 16 GiB over tp=2
    with pytest.raises(ConfigError, match="tensor x pipeline parallel size at most the 2 GPUs"):
        vllm_preflight(VllmConfig(model_path="llama", tensor_parallel_size=4), hardware="tiny", model=_llama())


def test_gpu_kv_cache_too_small_for_max_model_len() -> None:
    config = VllmConfig(model_path="llama", gpu_memory_utilization=0.9, enforce_eager=True, max_model_len=131_072)
    p = vllm_preflight(config, hardware="tiny", model=_llama())
    # 2,335 blocks, 2,334 usable: 37,344 tokens; one request of 131,072 needs 8,192 blocks (16 GiB).
    assert p.fail_phase == "kv_cache_alloc" and p.kv is not None and p.kv.estimated_max_model_len == 37_344
    # The utilization that would serve it (0.9 + 11.4 GiB / 24 GiB) is more than the GPU has: only the length.
    assert p.fix == "max_model_len=37344 (the longest that fits)"
    with pytest.raises(ConfigError, match="model"):
        vllm_preflight(config, hardware="tiny")  # model_path is no folder: no facts for the split


# -- reading the host, and the launch's refusal ------------------------------------------------------------


class _Canned:
    """A host whose commands print canned text (what the memory and model scripts would print)."""

    name = "box"

    def __init__(self, stdout: str) -> None:
        self.stdout = stdout
        self.argv: list[str] = []

    def run(self, command: list[str], *, timeout_s: float, input_text: str | None = None) -> Any:
        from dsv4lab.hosts.base import CommandResult

        self.argv = list(command)
        return CommandResult("box", " ".join(command), 0, self.stdout, "", 0.01)


def test_read_host_memory_parses_what_the_script_prints() -> None:
    from dsv4lab.serving.hostmem import read_host_memory

    node = "Node 1 MemTotal: 8388608 kB\nNode 1 MemFree: 2097152 kB\nNode 1 Active(file): 1048576 kB\n"
    text = (
        "@@meminfo\nMemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n"
        f"@@node 1\n{node}"
        f"@@cgroup {1 << 63} 123\n"  # cgroup v1's "no limit"
        "@@gpus 0\n@@env VLLM_CPU_KVCACHE_SPACE=4\n"
    )
    mem = read_host_memory(_Canned(text))  # type: ignore[arg-type]
    # Node 1: total 8 GiB, available 2 + 1 GiB; the sentinel is no limit; the host's KV space is seen.
    assert (mem.node, mem.total_gib, mem.available_gib, mem.gpus) == (1, 8.0, 3.0, 0)
    assert mem.env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    limited = read_host_memory(_Canned(text.replace(f"@@cgroup {1 << 63} 123", f"@@cgroup {4 * GIB} {3 * GIB}")))  # type: ignore[arg-type]
    assert (limited.total_gib, limited.available_gib) == (4.0, 1.0)


def test_read_model_facts_from_the_hosts_folder() -> None:
    from dsv4lab.serving.hostmem import read_model_facts

    host = _Canned(f"@@dir /models/tiny\n@@bytes {TINY_BYTES}\n@@config\n{json.dumps(TINY, indent=2)}\n")
    m = read_model_facts(host, "/models/tiny", env={"HF_HOME": "/hf"})  # type: ignore[arg-type]
    assert m is not None and m.name == "tiny" and m.weight_bytes == TINY_BYTES and m.layers == 2
    assert host.argv[-3:] == ["/models/tiny", "/hf", ""]  # the path and the config's Hugging Face cache
    assert read_model_facts(_Canned("@@none\n"), "Org/Model") is None  # type: ignore[arg-type]


class _Facts:
    def __init__(self, memory: HostMemory, model: ModelFacts | None) -> None:
        self._memory, self._model = memory, model
        self.asked: list[str] = []

    def memory(self) -> HostMemory:
        self.asked.append("memory")
        return self._memory

    def model_facts(self, model_path: str, env: Any) -> ModelFacts | None:
        self.asked.append("model")
        return self._model


def test_vllm_engine_refuses_on_a_cpu_host_only() -> None:
    from dsv4lab.engines import get_engine

    engine = get_engine("vllm")
    config = _cpu_config(env={"VLLM_CPU_KVCACHE_SPACE": "64"})
    prediction = engine.predict_on_host(config, "0.32.0", _Facts(_host(), _tiny()))
    assert prediction is not None and not prediction.fits
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE='64' is not valid") as refused:
        raise prediction.refusal()
    assert refused.value.field == "env.VLLM_CPU_KVCACHE_SPACE"
    # A GPU host: the split depends on what vLLM measures there, so no refusal on estimates (and no model read).
    gpu = _Facts(HostMemory("gpubox", 64 * GIB, 60 * GIB, gpus=8), _tiny())
    assert engine.predict_on_host(config, "0.32.0", gpu) is None
    assert gpu.asked == ["memory"]
    # The other engines read nothing.
    sglang = _Facts(_host(), None)
    assert get_engine("sglang").predict_on_host(object(), "0.5.23", sglang) is None
    assert sglang.asked == []


def test_launch_refuses_before_writing_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsv4lab.hosts import open_host
    from dsv4lab.serving.launch import launch

    monkeypatch.setenv("DSV4LAB_STATE_DIR", str(tmp_path / "state"))
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    config = VllmConfig(model_path=str(folder), env={"VLLM_CPU_KVCACHE_SPACE": "1000000"})
    run_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match="VLLM_CPU_KVCACHE_SPACE='1000000' is not valid"):
        launch(open_host(None), config, str(run_dir), target="vllm", check=False)
    assert not run_dir.exists()
