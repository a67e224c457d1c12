"""vLLM's memory, as arithmetic you can check before a launch.

vLLM fails for memory in two places that a launch reaches only after loading the model: the KV space it
was told to take does not fit in the memory there is, or the space it gets cannot hold one request of
``max_model_len`` tokens ("To serve at least one request with the model's max seq len (N)..."). Both
are decided by numbers known before the launch — the host's memory, the model's ``config.json`` and
weights, the config — so :func:`vllm_preflight` predicts them, says which step fails and by how much, and
names the change that fits.

On a host without a GPU (vLLM's CPU build) the prediction is vLLM's own arithmetic on the host's memory
node (:class:`HostMemory`); the only estimates are the memory vLLM's own processes take before the cache
(:data:`CPU_PROCESS_MEMORY_GIB`). On a GPU hardware profile it lays out the split vLLM logs (weights, peak
activation, non-torch memory, CUDA graph pool, KV cache under ``gpu_memory_utilization``); there the
activation, non-torch and graph terms are estimates (:class:`GpuEstimates`), stated as such.

Facts from vLLM 0.32's sources: ``platforms/cpu.py`` (``VLLM_CPU_KVCACHE_SPACE``, whole GiB, overrides
``kv_cache_memory_bytes``; CPU block size 128), ``utils/cpu_resource_utils.py`` (``get_memory_node_info``),
``v1/worker/cpu_worker.py`` (``determine_available_memory``), ``v1/core/kv_cache_utils.py``
(``get_kv_cache_configs``, ``_check_enough_kv_cache_memory``), ``v1/kv_cache_interface.py`` (page sizes),
``v1/worker/gpu_worker.py`` and ``v1/worker/utils.py`` (``request_memory``, the profiled split),
``config/vllm.py`` (CUDA-graph capture sizes), ``engine/arg_utils.py`` (scheduler defaults by device).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsv4lab.config.hardware import HardwareProfile, hardware_profile
from dsv4lab.config.vllm_config import VllmConfig
from dsv4lab.config.vllm_releases import VllmRelease, resolve_vllm_release
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError

__all__ = [
    "CPU_PROCESS_MEMORY_GIB",
    "CPU_WORKER_RSS_GIB",
    "DeviceSplit",
    "GpuEstimates",
    "HostMemory",
    "KvCapacity",
    "ModelFacts",
    "VllmPreflight",
    "kv_capacity",
    "vllm_preflight",
]

GIB = 1024**3
MIB = 1024**2

#: Memory vLLM's own processes (API server, EngineCore, worker: Python, torch, tokenizer) take out of the
#: node's available memory before the KV cache, the weights aside. An estimate: on vLLM 0.32's CPU build
#: serving a 4 MB model their resident sizes were about 0.6, 0.6 and 0.7 GiB, part of it shared library
#: pages that vLLM's "available" still counts.
CPU_PROCESS_MEMORY_GIB = 1.5
#: The worker's resident size before its cache, the weights aside: vLLM subtracts it from
#: ``gpu_memory_utilization x total`` when no KV space is given (an estimate, as above).
CPU_WORKER_RSS_GIB = 0.7

#: The startup steps a vLLM launch can fail at for memory, in the order it reaches them.
PHASES_IN_ORDER = ("startup_other", "weight_loading", "kv_cache_alloc", "cuda_graph_capture")

_DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "float16": 2,
    "half": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
#: KV-cache dtypes whose bytes per element are plain (the quantised layouts with scales are not modelled).
_KV_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1}
#: config.json keys vLLM derives the model's context from (the smallest present wins).
_MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num", "num_attention_groups")


def _gib(b: float) -> float:
    return b / GIB


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- the model ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What vLLM's memory depends on in a model: its attention shape, context, dtype and weights.

    Read from the model folder's ``config.json`` and the size of its ``*.safetensors``: on this machine by
    :meth:`from_folder`, or from what the caller read on the server host by :meth:`from_config_json`.
    """

    name: str
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_position_embeddings: int | None
    #: The checkpoint's dtype as config.json names it (``torch_dtype``, or ``dtype`` from transformers 5).
    dtype: str
    #: Bytes of the safetensors files (what loading the checkpoint reads).
    weight_bytes: int
    intermediate_size: int | None = None
    model_type: str = ""
    #: For MLA models (DeepSeek V2/V3): kv_lora_rank + qk_rope_head_dim, one latent per token and layer.
    mla_latent: int | None = None
    quantized: bool = False
    #: Why the KV layout is not modelled (compressed or state-space attention), or None.
    unmodelled: str | None = None

    @classmethod
    def from_config_json(cls, data: Mapping[str, Any], weight_bytes: int, *, name: str = "") -> ModelFacts:
        """From a parsed ``config.json`` (a multimodal model's ``text_config`` is where its LLM is)."""
        if not isinstance(data, Mapping):
            raise ConfigError("config.json", type(data).__name__, "a JSON object (the model's config.json)")
        text = data.get("text_config")
        cfg: Mapping[str, Any] = {**data, **text} if isinstance(text, Mapping) else data

        def count(key: str, value: Any) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"config.json {key}", value, "a positive integer")
            return value

        layers = count("num_hidden_layers", cfg.get("num_hidden_layers", cfg.get("n_layer")))
        heads = count("num_attention_heads", cfg.get("num_attention_heads", cfg.get("n_head")))
        hidden = count("hidden_size", cfg.get("hidden_size", cfg.get("n_embd")))
        kv_heads = next((cfg[k] for k in _KV_HEAD_KEYS if cfg.get(k) is not None), heads)
        head_dim = cfg.get("head_dim") or cfg.get("hidden_size_per_head") or hidden // heads
        lengths = [cfg[k] for k in _MAX_LEN_KEYS if isinstance(cfg.get(k), int) and not isinstance(cfg.get(k), bool)]
        max_len = int(cfg["model_max_length"]) if isinstance(cfg.get("model_max_length"), int) else None
        if max_len is None and lengths:
            max_len = min(lengths)
        dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or data.get("torch_dtype") or "float32")
        mla = None
        if cfg.get("kv_lora_rank"):
            mla = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
        unmodelled = None
        if cfg.get("compress_ratios"):
            unmodelled = "compressed sparse attention (DeepSeek-V4): its KV layout is not modelled"
        elif str(cfg.get("model_type", "")).lower().startswith(("mamba", "jamba", "falcon_h", "nemotron_h")):
            unmodelled = "state-space layers: their cache is not modelled"
        inter = cfg.get("intermediate_size")
        if isinstance(cfg.get("moe_intermediate_size"), int) and isinstance(cfg.get("num_experts_per_tok"), int):
            inter = cfg["moe_intermediate_size"] * cfg["num_experts_per_tok"]
        if isinstance(weight_bytes, bool) or not isinstance(weight_bytes, int) or weight_bytes < 0:
            raise ConfigError("weight_bytes", weight_bytes, "the safetensors files' size in bytes (an integer >= 0)")
        return cls(
            name=name or str(cfg.get("_name_or_path") or cfg.get("model_type") or "model"),
            layers=layers,
            attention_heads=heads,
            kv_heads=count("num_key_value_heads", kv_heads),
            head_dim=count("head_dim", head_dim),
            hidden_size=hidden,
            vocab_size=count("vocab_size", cfg.get("vocab_size")),
            max_position_embeddings=max_len,
            dtype=dtype,
            weight_bytes=weight_bytes,
            intermediate_size=inter if isinstance(inter, int) and inter > 0 else None,
            model_type=str(cfg.get("model_type", "")),
            mla_latent=mla,
            quantized=bool(cfg.get("quantization_config")),
            unmodelled=unmodelled,
        )

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelFacts:
        """From a model folder on this machine (``config.json`` and the ``*.safetensors`` beside it)."""
        folder = Path(path).expanduser()
        try:
            data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ConfigError(
                "model_path", str(path), "a model folder with a readable config.json", detail=str(exc)
            ) from exc
        size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
        return cls.from_config_json(data, size, name=folder.name)

    def served_dtype(self, dtype: str | None, *, bf16: bool = True) -> str:
        """The dtype vLLM serves in: the one asked for, else the checkpoint's, with float32 checkpoints
        downcast to the platform's first choice (bfloat16 on CPUs and on GPUs that have it)."""
        if dtype and dtype != "auto":
            return {"half": "float16", "float": "float32"}.get(dtype, dtype)
        ckpt = self.dtype.replace("torch.", "")
        if ckpt in ("float32", "float"):
            return "bfloat16" if bf16 else "float16"
        return ckpt if ckpt in _DTYPE_BYTES else "bfloat16"

    def weights_in_memory(self, dtype: str) -> int:
        """Bytes the weights take once loaded: the files' size, rescaled when an unquantised checkpoint is
        served in another dtype (a float32 checkpoint served as float32 takes its size, as bfloat16 half)."""
        ckpt = _DTYPE_BYTES.get(self.dtype.replace("torch.", ""))
        served = _DTYPE_BYTES.get(dtype)
        if self.quantized or not ckpt or not served:
            return self.weight_bytes
        return self.weight_bytes * served // ckpt

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# -- the host ----------------------------------------------------------------------------------------------


def _meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` or a node's ``meminfo`` as bytes by key (node lines start ``Node N``)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["Node"]:
            parts = parts[2:]
        if len(parts) >= 2 and parts[0].endswith(":") and parts[1].isdigit():
            unit = 1024 if parts[2:3] == ["kB"] else 1
            out[parts[0][:-1]] = int(parts[1]) * unit
    return out


@dataclass(frozen=True)
class HostMemory:
    """A host's memory as vLLM's CPU worker sees it when it sizes the KV cache.

    vLLM reads the memory node of the first CPU it may run on (``/sys/devices/system/node/nodeN/meminfo``):
    total is that node's ``MemTotal`` and "available" is ``MemFree + Active(file) + Inactive(file) +
    SReclaimable`` — not ``/proc/meminfo``'s ``MemAvailable``. A cgroup memory limit below the node's total
    replaces it, and available is capped at limit - usage. Without per-node files it falls back to
    ``MemTotal`` and ``MemAvailable`` (psutil's figures), with no cgroup cap.
    """

    host: str
    total_bytes: int
    available_bytes: int
    #: The NUMA node read, or None when the host has no per-node files.
    node: int | None = None
    #: ``MemAvailable`` of /proc/meminfo, for comparison (the kernel's estimate).
    mem_available_bytes: int | None = None
    #: GPUs nvidia-smi lists (0: a CPU host, where vLLM's CPU build runs).
    gpus: int = 0
    #: vLLM's memory variables as the host's environment sets them for a launch there (a config's ``env``
    #: overrides them).
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def total_gib(self) -> float:
        return _gib(self.total_bytes)

    @property
    def available_gib(self) -> float:
        return _gib(self.available_bytes)

    @property
    def where(self) -> str:
        return f"node {self.node} of {self.host}" if self.node is not None else self.host

    @classmethod
    def from_meminfo(
        cls,
        host: str,
        meminfo: str,
        *,
        node_meminfo: str | None = None,
        node: int | None = None,
        cgroup_limit: int | None = None,
        cgroup_usage: int | None = None,
        gpus: int = 0,
        env: Mapping[str, str] | None = None,
    ) -> HostMemory:
        """From the files' text as read on the host (``cgroup_limit`` None: no limit)."""
        system = _meminfo(meminfo)
        if "MemTotal" not in system:
            raise ConfigError("meminfo", meminfo[:60], "the text of /proc/meminfo (with a MemTotal line)")
        mem_available = system.get("MemAvailable")
        if node_meminfo is None:
            avail = mem_available if mem_available is not None else system.get("MemFree", 0)
            return cls(host, system["MemTotal"], avail, None, mem_available, gpus, dict(env or {}))
        n = _meminfo(node_meminfo)
        total = n.get("MemTotal", system["MemTotal"])
        avail = sum(n.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
        if cgroup_limit is not None and cgroup_limit < total:
            total = cgroup_limit
            avail = max(0, min(avail, cgroup_limit - (cgroup_usage or 0)))
        return cls(host, total, avail, node if node is not None else 0, mem_available, gpus, dict(env or {}))

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "node": self.node,
            "total_gib": round(self.total_gib, 3),
            "available_gib": round(self.available_gib, 3),
            "mem_available_gib": None if self.mem_available_bytes is None else round(_gib(self.mem_available_bytes), 3),
            "gpus": self.gpus,
            "env": dict(self.env),
        }


# -- KV capacity ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KvCapacity:
    """What a KV cache of ``kv_bytes`` holds, in vLLM's blocks, against one request of ``max_model_len``."""

    kv_bytes: int
    block_size: int
    #: One block over the worker's attention layers (K and V, or MLA's one latent).
    bytes_per_block: int
    max_model_len: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    @property
    def num_blocks(self) -> int:
        return max(0, self.kv_bytes // self.bytes_per_block)

    @property
    def usable_bytes(self) -> int:
        """What the capacity check plans with: the null block the block pool keeps back is not usable."""
        return self.kv_bytes - self.bytes_per_block

    @property
    def needed_bytes(self) -> int:
        """One request at ``max_model_len``: whole blocks."""
        return self.bytes_per_block * _cdiv(self.max_model_len, self.block_size)

    @property
    def fits(self) -> bool:
        return self.usable_bytes > 0 and self.needed_bytes <= self.usable_bytes

    @property
    def estimated_max_model_len(self) -> int:
        """vLLM's own estimate when it refuses: the longest context whose blocks fit (0 when none does)."""
        if self.usable_bytes <= 0:
            return 0
        return min(self.max_model_len, (self.usable_bytes // self.bytes_per_block) * self.block_size)

    @property
    def bytes_for_max_model_len(self) -> int:
        """The KV space that serves one ``max_model_len`` request: its blocks plus the null block."""
        return self.bytes_per_block * (_cdiv(self.max_model_len, self.block_size) + 1)

    @property
    def max_concurrency(self) -> float:
        return self.num_blocks / _cdiv(self.max_model_len, self.block_size)

    @property
    def tokens(self) -> int:
        """The ``KV cache size: N tokens`` vLLM logs (concurrency x max_model_len)."""
        return int(self.max_concurrency * self.max_model_len)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_gib": round(_gib(self.kv_bytes), 3),
            "block_size": self.block_size,
            "bytes_per_block": self.bytes_per_block,
            "bytes_per_token": self.bytes_per_token,
            "num_blocks": self.num_blocks,
            "tokens": self.tokens,
            "max_model_len": self.max_model_len,
            "max_concurrency": round(self.max_concurrency, 2),
            "needed_gib": round(_gib(self.needed_bytes), 3),
            "fits": self.fits,
            "estimated_max_model_len": self.estimated_max_model_len,
            "gib_for_max_model_len": round(_gib(self.bytes_for_max_model_len), 3),
        }


def kv_capacity(
    model: ModelFacts,
    kv_bytes: int,
    max_model_len: int,
    *,
    block_size: int,
    kv_dtype_bytes: int,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
) -> KvCapacity:
    """The cache of one worker: its layers (``layers / pp``), its KV heads (``kv_heads / tp``, at least
    one) and a page of ``block_size`` tokens per layer, as ``v1/kv_cache_interface.py`` sizes them."""
    layers = _cdiv(model.layers, pipeline_parallel_size)
    if model.mla_latent:
        page = block_size * model.mla_latent * kv_dtype_bytes
    else:
        heads = max(1, model.kv_heads // tensor_parallel_size)
        page = block_size * heads * 2 * model.head_dim * kv_dtype_bytes
    return KvCapacity(kv_bytes, block_size, layers * page, max_model_len)


# -- GPU estimates -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuEstimates:
    """The terms of vLLM's GPU split that a preflight cannot read from the config or the model. Each is an
    estimate [E]; vLLM measures them in its profiling run, and its log line ``Actual usage is X GiB for
    consumed memory (weights + non-torch), Y GiB for peak activation, and Z GiB for CUDAGraph memory``
    gives the real values to put here."""

    #: Non-torch memory allocated after vLLM's baseline snapshot (cuBLAS workspaces, attention-backend
    #: buffers, custom all-reduce); the CUDA context and NCCL come before it and are outside the budget.
    non_torch_gib: float = 0.5
    #: Peak activation of the profiling forward, per token of ``max_num_batched_tokens``, in units of the
    #: activation dtype: ``4 x hidden`` (residual, QKV, attention output) ``+ 2 x intermediate / tp``.
    activation_hidden_factor: float = 4.0
    activation_intermediate_factor: float = 2.0
    #: The dummy sampler run: ``max_num_seqs x vocab`` float32 logits and about two more such tensors.
    sampler_copies: float = 3.0
    #: One CUDA-graph capture size costs this per layer on the worker (MiB): 2.51 GiB for 51 sizes of a
    #: 43-layer DeepSeek-V4-Flash (vllm-project/vllm#50576).
    graph_mib_per_size_per_layer: float = 2.51 * 1024 / 51 / 43


def _scheduler_defaults(gpu_gib: float, gpu_name: str, world: int, cpu: bool) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) ``vllm serve`` picks when unset (``engine/arg_utils.py``)."""
    if cpu:
        return 2048 * world, 128 * world
    if gpu_gib >= 160:
        return 16384, 1024
    if gpu_gib >= 70 and "a100" not in gpu_name.lower():
        return 8192, 1024
    return 2048, 256


def _capture_sizes(config: VllmConfig, max_num_seqs: int, max_tokens: int, sm: str) -> tuple[int, ...]:
    """The batch sizes vLLM captures as CUDA graphs (``config/vllm.py``): none eager, the given list, or
    1, 2, 4, then every 8 below 256, every 16 from 256, up to 2 x max_num_seqs (at most 512; 1024 on sm_100)."""
    if config.enforce_eager:
        return ()
    if config.cudagraph_capture_sizes is not None:
        return tuple(s for s in config.cudagraph_capture_sizes if s <= max_tokens)
    top = config.max_cudagraph_capture_size
    if top is None:
        top = min(max_num_seqs * 2, 1024 if sm.startswith("sm_10") else 512)
    top = min(top, max_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    if max_tokens <= top and max_tokens not in sizes:
        sizes.append(max_tokens)
    return tuple(sorted(set(sizes)))


# -- the prediction -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceSplit:
    """One device's memory as vLLM divides it, in GiB. A CPU host's memory node is its one device; there
    ``non_torch_gib`` is the memory vLLM's own processes take (:data:`CPU_PROCESS_MEMORY_GIB`) and there is
    no activation or graph term."""

    device: str
    total_gib: float
    #: Free memory when vLLM starts (on a CPU host: the node's available memory when the preflight ran).
    free_gib: float
    #: ``total x gpu_memory_utilization``, or the explicit KV space when one is given.
    requested_gib: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float
    cuda_graph_gib: float
    kv_cache_gib: float
    fail_phase: str | None = None
    short_by_gib: float | None = None

    @property
    def fits(self) -> bool:
        return self.fail_phase is None

    def to_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class VllmPreflight:
    """A prediction of a vLLM launch's memory: fits, or the step that fails, by how much, why and the fix."""

    config: VllmConfig
    backend: Literal["cpu", "gpu"]
    #: The host (CPU) or hardware profile (GPU) predicted for.
    where: str
    vllm_version: str
    model: ModelFacts | None
    split: tuple[DeviceSplit, ...]
    kv: KvCapacity | None
    fail_phase: str | None = None
    short_by_gib: float | None = None
    #: What vLLM would stop with, in its words and with the numbers.
    reason: str | None = None
    #: The change predicted to fit.
    fix: str | None = None
    #: The config field the fix changes (``env.VLLM_CPU_KVCACHE_SPACE``, ``max_model_len``, ...).
    fix_field: str | None = None
    notes: tuple[str, ...] = ()
    #: What sizes the KV cache: ``VLLM_CPU_KVCACHE_SPACE``, ``kv_cache_memory_bytes`` or
    #: ``gpu_memory_utilization``.
    kv_source: str = "gpu_memory_utilization"
    #: The host's memory a CPU prediction was made from.
    host_memory: HostMemory | None = None

    @property
    def fits(self) -> bool:
        return self.fail_phase is None

    def explain(self) -> str:
        """The split and the verdict in words and numbers, for reports and the CLI."""
        lines: list[str] = []
        d = min(self.split, key=lambda s: s.free_gib)  # the tightest device
        if self.backend == "cpu":
            lines.append(
                f"{d.device}: {d.free_gib:.2f} of {d.total_gib:.2f} GiB available; {self.kv_source} asks "
                f"{d.requested_gib:.2f} GiB, weights {d.weights_gib:.3f} GiB, vLLM's processes about "
                f"{d.non_torch_gib:.2f} GiB [E]."
            )
        else:
            lines.append(
                f"{d.device}: {d.total_gib:.2f} GiB, {d.free_gib:.2f} free at start, requested {d.requested_gib:.2f} "
                f"GiB; weights {d.weights_gib:.2f}, peak activation {d.activation_gib:.2f} [E], non-torch "
                f"{d.non_torch_gib:.2f} [E], CUDA graph pool {d.cuda_graph_gib:.2f} [E] -> KV cache "
                f"{d.kv_cache_gib:.2f} GiB."
            )
        if self.kv is not None:
            k = self.kv
            lines.append(
                f"KV cache: {k.num_blocks:,} blocks of {k.block_size} tokens ({k.bytes_per_block:,} B per block, "
                f"{k.bytes_per_token:,.0f} B per token) = {k.tokens:,} tokens; one request of max_model_len "
                f"{k.max_model_len:,} needs {_gib(k.needed_bytes):.3f} GiB."
            )
        if self.fits:
            lines.append("Predicted: fits.")
        else:
            lines.append(
                f"Predicted: fails in {self.fail_phase}, short by {self.short_by_gib or 0:.2f} GiB: {self.reason}"
            )
            if self.fix:
                lines.append(f"Fix: {self.fix}")
        lines.extend(self.notes)
        return "\n".join(lines)

    def refusal(self) -> ConfigError:
        """The error a launch refused for this prediction raises: the field, its value, the fix."""
        value: Any = None
        if self.fix_field:
            head, _, key = self.fix_field.partition(".")
            inherited = self.host_memory.env if self.host_memory else {}
            value = (
                self.config.env.get(key, inherited.get(key)) if head == "env" else getattr(self.config, self.fix_field)
            )
        return ConfigError(
            self.fix_field or "config",
            value,
            f"a value that fits: {self.fix or 'see dsv4lab preflight --engine vllm'}",
            detail=f"predicted to fail in {self.fail_phase}, short by {self.short_by_gib or 0:.2f} GiB: {self.reason}",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "vllm",
            "fits": self.fits,
            "fail_phase": self.fail_phase,
            "short_by_gib": None if self.short_by_gib is None else round(self.short_by_gib, 3),
            "reason": self.reason,
            "fix": self.fix,
            "field": self.fix_field,
            "kv_source": self.kv_source,
            "host_memory": self.host_memory.to_dict() if self.host_memory else None,
            "backend": self.backend,
            "where": self.where,
            "vllm_version": self.vllm_version,
            "model": self.model.to_dict() if self.model else None,
            "split": [d.to_dict() for d in self.split],
            "kv": self.kv.to_dict() if self.kv else None,
            "notes": list(self.notes),
            "explanation": self.explain(),
        }

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        rows = [
            {
                "device": d.device,
                "total (GiB)": d.total_gib,
                "free (GiB)": d.free_gib,
                "requested (GiB)": d.requested_gib,
                "weights (GiB)": d.weights_gib,
                "activation (GiB)": d.activation_gib,
                "non-torch (GiB)": d.non_torch_gib,
                "CUDA graphs (GiB)": d.cuda_graph_gib,
                "KV cache (GiB)": d.kv_cache_gib,
                "verdict": "fits" if d.fits else f"fails in {d.fail_phase}",
            }
            for d in self.split
        ]
        if self.fits:
            status, state = "fits", "ok"
        else:
            status, state = f"fails in {self.fail_phase}, short by {self.short_by_gib or 0:.2f} GiB", "fail"
        name = self.model.name if self.model else "model unknown"
        head = f"{self.where} ({self.backend.upper()}), vLLM {self.vllm_version}, {name}"
        body = hv.p(head) + hv.table(rows, max_rows=8)
        if self.reason:
            body += hv.p(self.reason)
        if self.fix:
            body += hv.p(f"Fix: {self.fix}")
        body += hv.fold(self.explain().splitlines(), keep=4, summary="the arithmetic")
        return hv.card("vLLM memory preflight", body, state=state, status=status)  # type: ignore[arg-type]


def _kv_space(config: VllmConfig, host_env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """The explicit KV space in bytes and the field it comes from: ``VLLM_CPU_KVCACHE_SPACE`` (whole GiB;
    on the CPU backend it replaces ``kv_cache_memory_bytes``; the config's env over the host's), else
    ``kv_cache_memory_bytes``."""
    raw = config.env.get("VLLM_CPU_KVCACHE_SPACE", host_env.get("VLLM_CPU_KVCACHE_SPACE"))
    if raw is not None and raw != "":
        try:
            return int(raw) * GIB, "env.VLLM_CPU_KVCACHE_SPACE"
        except ValueError:
            raise ConfigError(
                "env.VLLM_CPU_KVCACHE_SPACE",
                raw,
                "a whole number of GiB, e.g. 4 (vLLM's CPU backend reads it with int() and stops at startup otherwise)",
            ) from None
    if config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes, "kv_cache_memory_bytes"
    return None, None


def _kv_dtype_bytes(config: VllmConfig, served: str) -> int | None:
    kv = config.kv_cache_dtype
    if kv in (None, "auto"):
        return _DTYPE_BYTES.get(served)
    return _KV_DTYPE_BYTES.get(kv)


def _max_model_len(config: VllmConfig, model: ModelFacts | None) -> int | None:
    if config.max_model_len:
        return config.max_model_len
    return model.max_position_embeddings if model else None


def _model_for(config: VllmConfig, model: ModelFacts | None) -> ModelFacts | None:
    if model is not None:
        return model
    folder = Path(config.model_path).expanduser()
    if (folder / "config.json").is_file():
        return ModelFacts.from_folder(folder)
    return None


def vllm_preflight(
    config: VllmConfig,
    host_memory: HostMemory | None = None,
    hardware: HardwareProfile | str | None = None,
    model: ModelFacts | None = None,
    *,
    vllm_version: str | VllmRelease | None = None,
    estimates: GpuEstimates | None = None,
    model_from_path: bool = True,
) -> VllmPreflight:
    """Predict how a vLLM launch of ``config`` goes for memory: on a CPU host from ``host_memory``
    (:func:`dsv4lab.serving.hostmem.read_host_memory`), or on a GPU ``hardware`` profile.

    ``model`` defaults to the facts of ``config.model_path`` when that is a folder on this machine
    (``model_from_path=False``: never, for a model that lives on another host); without them only the CPU
    KV-space check runs (the weights count as nothing) and a note says so.
    """
    if not isinstance(config, VllmConfig):
        raise ConfigError("config", type(config).__name__, "a VllmConfig (vLLM's memory model is for vLLM configs)")
    release = resolve_vllm_release(vllm_version)
    facts = model if model is not None or not model_from_path else _model_for(config, None)
    if hardware is not None:
        hw = hardware_profile(hardware) if isinstance(hardware, str) else hardware
        return _gpu(config, hw, facts, release, estimates or GpuEstimates())
    if host_memory is None:
        raise ConfigError(
            "host_memory",
            None,
            "the host's memory (dsv4lab.serving.hostmem.read_host_memory(host)) for a CPU host, or hardware= "
            "a GPU profile",
        )
    return _cpu(config, host_memory, facts, release)


def _capacity(
    config: VllmConfig, facts: ModelFacts | None, kv_bytes: int, served: str, block_size: int, notes: list[str]
) -> KvCapacity | None:
    if facts is None:
        notes.append(
            "Model facts unknown (model_path is not a folder here): the max_model_len check did not run; pass "
            "model=ModelFacts.from_config_json(...) read on the server host."
        )
        return None
    if facts.unmodelled:
        notes.append(f"{facts.name}: {facts.unmodelled}; the max_model_len check did not run.")
        return None
    kvb = _kv_dtype_bytes(config, served)
    length = _max_model_len(config, facts)
    if kvb is None or length is None:
        why = f"kv_cache_dtype {config.kv_cache_dtype!r}" if kvb is None else "the model's context length"
        notes.append(f"{why} is not modelled: the max_model_len check did not run.")
        return None
    allow_long = config.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "").lower() in ("1", "true")
    if facts.max_position_embeddings and length > facts.max_position_embeddings and not allow_long:
        notes.append(
            f"max_model_len {length:,} is above the model's {facts.max_position_embeddings:,}: vLLM refuses it at "
            "startup unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 is in env (or rope scaling raises the model's length)."
        )
    return kv_capacity(
        facts,
        kv_bytes,
        length,
        block_size=block_size,
        kv_dtype_bytes=kvb,
        tensor_parallel_size=config.tensor_parallel_size,
        pipeline_parallel_size=config.pipeline_parallel_size,
    )


def _capacity_failure(kv: KvCapacity, space_fix: str | None, space_field: str) -> tuple[float, str, str, str]:
    """(short_by_gib, reason, fix, field) for a KV cache that cannot hold one max_model_len request;
    ``space_fix`` is the KV space that would serve it, in the words of the setting that sizes it (None:
    none that fits)."""
    est = kv.estimated_max_model_len
    if kv.usable_bytes <= 0:
        reason = (
            f"vLLM stops with 'No available memory for the cache blocks': {_gib(kv.kv_bytes):.3f} GiB of KV cache "
            f"is not more than one block ({kv.bytes_per_block:,} B)."
        )
    else:
        reason = (
            f"vLLM stops with 'To serve at least one request with the model's max seq len ({kv.max_model_len}), "
            f"({_gib(kv.needed_bytes):.2f} GiB KV cache is needed, which is larger than the available KV cache "
            f"memory ({_gib(kv.usable_bytes):.2f} GiB)'"
            + (f"; its estimated maximum model length is {est}." if est else ".")
        )
    short = _gib(kv.bytes_for_max_model_len - kv.kv_bytes)
    serves = f"(the space that serves max_model_len {kv.max_model_len:,})"
    if est:
        fix = f"max_model_len={est} (the longest that fits)" + (f", or {space_fix} {serves}" if space_fix else "")
        return short, reason, fix, "max_model_len"
    if space_fix:
        return short, reason, f"{space_fix} {serves}", space_field
    return short, reason, "a shorter max_model_len and more memory for the KV cache", "max_model_len"


def _cpu(config: VllmConfig, mem: HostMemory, facts: ModelFacts | None, release: VllmRelease) -> VllmPreflight:
    notes: list[str] = []
    if mem.gpus:
        notes.append(
            f"{mem.host} has {plural(mem.gpus, 'GPU')}: this is the CPU build's arithmetic; pass hardware= a GPU "
            "profile for the GPU split."
        )
    served = facts.served_dtype(config.dtype) if facts else (config.dtype or "bfloat16")
    weights = facts.weights_in_memory(served) if facts else 0
    if facts is None:
        notes.append("Weights unknown: they are counted as 0 GiB.")
    total, avail = mem.total_bytes, mem.available_bytes
    processes = int(CPU_PROCESS_MEMORY_GIB * GIB)
    at_alloc = avail - processes - weights
    explicit, space_field = _kv_space(config, mem.env)
    util = config.gpu_memory_utilization or release.default_gpu_memory_utilization
    fail: str | None = None
    short: float | None = None
    reason = fix = field_name = None
    if explicit is not None:
        kv_bytes = explicit
        requested = explicit
        if explicit > at_alloc:
            fail, short = "kv_cache_alloc", _gib(explicit - at_alloc)
            name = space_field.partition(".")[2] or space_field if space_field else "the KV space"
            reason = (
                f"{name} asks for {_gib(explicit):.2f} GiB of KV cache; {mem.where} has {_gib(avail):.2f} of "
                f"{_gib(total):.2f} GiB available, about {_gib(at_alloc):.2f} GiB once the weights "
                f"({_gib(weights):.3f} GiB) and vLLM's processes (about {CPU_PROCESS_MEMORY_GIB:.1f} GiB) are in: vLLM "
                f"stops at the KV cache allocation with 'Available memory on node ... is less than requested memory "
                f"for kv'."
            )
            fit = math.floor(_gib(at_alloc))
            if space_field == "env.VLLM_CPU_KVCACHE_SPACE":
                fix = (
                    f"VLLM_CPU_KVCACHE_SPACE={fit} (whole GiB, at most what is left)"
                    if fit >= 1
                    else "free memory on the host: not even 1 GiB is left for the KV cache"
                )
            else:
                fix = f"kv_cache_memory_bytes={max(0, at_alloc) // MIB * MIB} or less"
            field_name = space_field
    else:
        requested = math.ceil(total * util)
        at_start = avail - processes
        kv_bytes = int(requested - (CPU_WORKER_RSS_GIB * GIB + weights))
        share = math.floor((at_start / total - 0.01) * 100) / 100
        if requested > at_start:
            fail, short = "startup_other", _gib(requested - at_start)
            reason = (
                f"No KV space given: vLLM's CPU worker reserves gpu_memory_utilization x total = {util} x "
                f"{_gib(total):.2f} = {_gib(requested):.2f} GiB of {mem.where}, which has {_gib(avail):.2f} GiB "
                f"available (about {_gib(at_start):.2f} with vLLM's processes): it stops at startup with '... is "
                f"less than desired CPU memory utilization'."
            )
            fix = "env VLLM_CPU_KVCACHE_SPACE=N (whole GiB of KV cache)" + (
                f", or gpu_memory_utilization={share:.2f}" if share > 0 else ""
            )
            field_name = "env.VLLM_CPU_KVCACHE_SPACE"
        elif kv_bytes <= 0 or kv_bytes > at_alloc:
            fail = "kv_cache_alloc"
            short = _gib(kv_bytes - at_alloc) if kv_bytes > 0 else _gib(-kv_bytes)
            reason = (
                f"No KV space given: the cache would get {_gib(requested):.2f} GiB minus the worker's memory "
                f"= {_gib(kv_bytes):.2f} GiB against {_gib(at_alloc):.2f} GiB available then: vLLM stops at the "
                "KV cache allocation."
            )
            fix = "env VLLM_CPU_KVCACHE_SPACE=N (whole GiB that fit)"
            field_name = "env.VLLM_CPU_KVCACHE_SPACE"
        notes.append(
            f"No VLLM_CPU_KVCACHE_SPACE in the config's env or the host's: the KV cache is sized from "
            f"gpu_memory_utilization {util} of the node's memory."
        )
    block = config.block_size or (16 if facts is not None and facts.mla_latent else 128)
    kv = _capacity(config, facts, max(kv_bytes, 0), served, block, notes)
    if fail is None and kv is not None and not kv.fits:
        fail = "kv_cache_alloc"
        need = kv.bytes_for_max_model_len
        if space_field == "kv_cache_memory_bytes":
            space_fix = f"kv_cache_memory_bytes={need}" if need <= at_alloc else None
        else:
            space_fix = (
                f"VLLM_CPU_KVCACHE_SPACE={math.ceil(need / GIB)}" if math.ceil(need / GIB) * GIB <= at_alloc else None
            )
        short, reason, fix, field_name = _capacity_failure(kv, space_fix, space_field or "env.VLLM_CPU_KVCACHE_SPACE")
    split = DeviceSplit(
        device=mem.where,
        total_gib=mem.total_gib,
        free_gib=mem.available_gib,
        requested_gib=_gib(requested),
        weights_gib=_gib(weights),
        activation_gib=0.0,
        non_torch_gib=CPU_PROCESS_MEMORY_GIB,
        cuda_graph_gib=0.0,
        kv_cache_gib=_gib(max(kv_bytes, 0)),
        fail_phase=fail,
        short_by_gib=short,
    )
    return VllmPreflight(
        config=config,
        backend="cpu",
        where=mem.host,
        vllm_version=release.version,
        model=facts,
        split=(split,),
        kv=kv,
        fail_phase=fail,
        short_by_gib=short,
        reason=reason,
        fix=fix,
        fix_field=field_name,
        notes=tuple(notes),
        kv_source=(space_field or "").partition(".")[2] or space_field or "gpu_memory_utilization",
        host_memory=mem,
    )


def _gpu(
    config: VllmConfig, hw: HardwareProfile, facts: ModelFacts | None, release: VllmRelease, est: GpuEstimates
) -> VllmPreflight:
    if facts is None:
        raise ConfigError(
            "model",
            config.model_path,
            "the model's facts for the GPU split: a model folder on this machine as model_path, or "
            "model=ModelFacts.from_config_json(config_json, weight_bytes)",
        )
    tp, pp = config.tensor_parallel_size, config.pipeline_parallel_size
    if tp * pp > hw.count:
        raise ConfigError(
            "tensor_parallel_size",
            tp,
            f"tensor x pipeline parallel size at most the {plural(hw.count, 'GPU')} of {hw.name} (now {tp * pp})",
        )
    notes: list[str] = []
    sm = hw.gpu.sm
    bf16 = not sm.startswith(("sm_7", "sm_6"))
    served = facts.served_dtype(config.dtype, bf16=bf16)
    act_bytes = _DTYPE_BYTES.get(served, 2)
    util = config.gpu_memory_utilization or release.default_gpu_memory_utilization
    total = hw.gpu.total_gib
    requested = total * util
    weights = _gib(facts.weights_in_memory(served)) / (tp * pp)
    batched_default, seqs_default = _scheduler_defaults(total, hw.gpu.name, tp * pp, cpu=False)
    tokens = config.max_num_batched_tokens or batched_default
    seqs = config.max_num_seqs or seqs_default
    inter = facts.intermediate_size or 4 * facts.hidden_size
    per_token = est.activation_hidden_factor * facts.hidden_size + est.activation_intermediate_factor * inter / tp
    activation = _gib(tokens * act_bytes * per_token + seqs * facts.vocab_size * 4 * est.sampler_copies)
    sizes = _capture_sizes(config, seqs, tokens, sm)
    layers = _cdiv(facts.layers, pp)
    graphs = len(sizes) * layers * est.graph_mib_per_size_per_layer / 1024
    non_torch = est.non_torch_gib
    profiles_graphs = release.key >= (0, 21, 0) and config.env.get("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS") != "0"
    explicit = config.kv_cache_memory_bytes
    space_field = "kv_cache_memory_bytes" if explicit else None
    if explicit:
        kv_gib = _gib(explicit)
    else:
        kv_gib = requested - weights - activation - non_torch - (graphs if profiles_graphs else 0.0)
    splits: list[DeviceSplit] = []
    for i, free in enumerate(hw.free_before_load_gib()[: tp * pp]):
        fail: str | None = None
        short: float | None = None
        if not explicit and free < requested:
            fail, short = "startup_other", requested - free
        elif weights > free:
            fail, short = "weight_loading", weights - free
        elif explicit and weights + non_torch + activation + kv_gib > free:
            fail, short = "kv_cache_alloc", weights + non_torch + activation + kv_gib - free
        elif not explicit and kv_gib <= 0:
            fail, short = "kv_cache_alloc", -kv_gib
        elif weights + non_torch + activation + max(kv_gib, 0) + graphs > free:
            fail, short = "cuda_graph_capture", weights + non_torch + activation + kv_gib + graphs - free
        asked = _gib(explicit) if explicit else requested
        splits.append(
            DeviceSplit(
                f"GPU {i}", total, free, asked, weights, activation, non_torch, graphs, max(kv_gib, 0.0), fail, short
            )
        )
    failing = [d for d in splits if not d.fits]
    fail = short = reason = fix = field_name = None
    if failing:
        worst = min(failing, key=lambda d: (PHASES_IN_ORDER.index(d.fail_phase or ""), -(d.short_by_gib or 0.0)))
        fail, short = worst.fail_phase, worst.short_by_gib
        reason, fix, field_name = _gpu_words(worst, util, explicit is not None)
    block = config.block_size or 16
    kv_bytes = int(max(kv_gib, 0.0) * GIB)
    kv = _capacity(config, facts, kv_bytes, served, block, notes)
    if fail is None and kv is not None and not kv.fits:
        fail = "kv_cache_alloc"
        grow = _gib(kv.bytes_for_max_model_len - kv.kv_bytes)
        if explicit:
            space_fix: str | None = f"kv_cache_memory_bytes={kv.bytes_for_max_model_len}"
        else:
            more = math.ceil((util + grow / total) * 100) / 100
            space_fix = (
                f"gpu_memory_utilization={more:.2f}" if more <= min(s.free_gib for s in splits) / total else None
            )
        short, reason, fix, field_name = _capacity_failure(kv, space_fix, space_field or "gpu_memory_utilization")
    notes.append(
        f"Estimated [E]: peak activation ({tokens:,} batched tokens, {seqs:,} sequences), non-torch memory, and the "
        f"CUDA graph pool ({plural(len(sizes), 'capture size')}); weights are the checkpoint's size / (tp x pp)."
    )
    if not profiles_graphs and graphs:
        notes.append(
            f"vLLM {release.version} does not subtract CUDA graph memory before sizing the KV cache: the graphs must "
            "fit in the memory gpu_memory_utilization leaves out."
        )
    return VllmPreflight(
        config=config,
        backend="gpu",
        where=hw.name,
        vllm_version=release.version,
        model=facts,
        split=tuple(splits),
        kv=kv,
        fail_phase=fail,
        short_by_gib=short,
        reason=reason,
        fix=fix,
        fix_field=field_name,
        notes=tuple(notes),
        kv_source=space_field or "gpu_memory_utilization",
    )


def _gpu_words(d: DeviceSplit, util: float, explicit: bool) -> tuple[str, str, str]:
    """(reason, fix, field) for a GPU that fails before the capacity check."""
    if d.fail_phase == "startup_other":
        share = math.floor((d.free_gib / d.total_gib - 0.01) * 100) / 100
        return (
            f"{d.device} has {d.free_gib:.2f} of {d.total_gib:.2f} GiB free at start, less than "
            f"gpu_memory_utilization {util} x {d.total_gib:.2f} = {d.requested_gib:.2f} GiB: vLLM stops with 'Free "
            "memory on device ... is less than desired GPU memory utilization'.",
            f"gpu_memory_utilization={share:.2f}, or free the GPU",
            "gpu_memory_utilization",
        )
    if d.fail_phase == "weight_loading":
        return (
            f"The weights take {d.weights_gib:.2f} GiB per GPU, more than the {d.free_gib:.2f} GiB free on {d.device}.",
            "a larger tensor_parallel_size or a quantised checkpoint",
            "tensor_parallel_size",
        )
    if d.fail_phase == "cuda_graph_capture":
        return (
            f"After the KV cache, the CUDA graph pool (about {d.cuda_graph_gib:.2f} GiB) does not fit in what is free "
            f"on {d.device}.",
            "a lower gpu_memory_utilization, a smaller max_cudagraph_capture_size, or enforce_eager=true",
            "max_cudagraph_capture_size",
        )
    if explicit:
        return (
            f"kv_cache_memory_bytes asks for {d.kv_cache_gib:.2f} GiB on top of weights, activation and non-torch "
            f"memory; {d.device} has {d.free_gib:.2f} GiB free: the KV cache allocation runs out of memory.",
            f"kv_cache_memory_bytes below {max(0.0, d.kv_cache_gib - (d.short_by_gib or 0)):.2f} GiB",
            "kv_cache_memory_bytes",
        )
    return (
        f"{util} x {d.total_gib:.2f} = {d.requested_gib:.2f} GiB requested leaves nothing for the KV cache after "
        f"weights {d.weights_gib:.2f}, peak activation {d.activation_gib:.2f}, non-torch {d.non_torch_gib:.2f} and "
        f"CUDA graphs {d.cuda_graph_gib:.2f} GiB: vLLM stops with 'No available memory for the cache blocks'.",
        f"gpu_memory_utilization={min(0.98, util + (d.short_by_gib or 0) / d.total_gib + 0.02):.2f}, or a larger "
        "tensor_parallel_size",
        "gpu_memory_utilization",
    )
