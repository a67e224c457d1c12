"""The story's configurations, as presets.

Config A is the tuned baseline, Config B adds MTP speculative decoding at the same memory fraction (and
dies in CUDA graph capture), Config B-fixed is the change that made it start. Keeping them as code means
every notebook, test and report refers to exactly the same values.
"""

from __future__ import annotations

from collections.abc import Callable

from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.errors import UnknownNameError

__all__ = ["PRESETS", "config_a", "config_b", "config_b_fixed", "preset"]

MODEL = "deepseek-ai/DeepSeek-V4-Flash"

#: Where the autotuned FP8 block-GEMM JSONs live on the host (installed into SGLang at launch).
KERNEL_CONFIG_DIR = "~/dsv4-kernel-configs"


def config_a() -> ServerConfig:
    """Baseline with the cheap levers: tuned FP8 GEMM configs, NCCL LL/Ring, CUDA graphs, 0.70."""
    return ServerConfig(
        model_path=MODEL,
        tp=8,
        mem_fraction_static=0.70,
        trust_remote_code=True,
        env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
        kernel_config_dir=KERNEL_CONFIG_DIR,
    )


def config_b() -> ServerConfig:
    """A plus MTP (EAGLE 1/1/2, NextN head from the base checkpoint), same memory fraction."""
    return config_a().replace(
        speculative=SpeculativeConfig(algorithm="EAGLE", num_steps=1, eagle_topk=1, num_draft_tokens=2)
    )


def config_b_fixed() -> ServerConfig:
    """B with the fix that let it start: more slack for graphs and a smaller captured batch."""
    return config_b().replace(mem_fraction_static=0.60, cuda_graph_max_bs=16)


#: The story's configs by the names notebooks, campaign files and ``--preset`` use.
PRESETS: dict[str, Callable[[], ServerConfig]] = {
    "config_a": config_a,
    "config_b": config_b,
    "config_b_fixed": config_b_fixed,
}


def preset(name: str) -> ServerConfig:
    """A preset by name (``config_a``, ``config_b``, ``config_b_fixed``)."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise UnknownNameError("preset", name, PRESETS) from None
