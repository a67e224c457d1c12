"""The memory-bandwidth roofline of decode: the tok/s no kernel can beat on a given host.

A decode step has to read, on every TP rank, the dense weights, the routed experts its tokens touch and the
KV cache of every request; at full HBM bandwidth with no other cost that takes ``bytes / bandwidth``.
Measured throughput divided by this bound says how much of the hardware a configuration uses, which is the
number that separates "needs a better config" from "needs a better kernel" (the story's 23 tok/s is well
under 1 % of it). The byte counts are the ones the twin's timing model uses (``dsv4lab.config.hardware``), here
with perfect efficiency and no latency floor.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsv4lab.config.hardware import HardwareProfile, ModelProfile, hardware_profile, model_profile
from dsv4lab.errors import ConfigError

__all__ = ["Roofline", "decode_roofline", "distinct_experts"]


def distinct_experts(tokens: float, routed: int, top_k: int) -> float:
    """Expected distinct routed experts per layer touched by ``tokens`` tokens (uniform top-k routing)."""
    if tokens <= 0:
        return 0.0
    return float(routed * (1.0 - (1.0 - top_k / routed) ** tokens))


@dataclass(frozen=True)
class Roofline:
    """The bound for one load: bytes every rank reads per step, and the tok/s that gives at full bandwidth."""

    hardware: str
    model: str
    tp: int
    concurrency: int
    context_tokens: int
    query_tokens: int
    accepted_per_step: float
    bytes_per_step: float
    bandwidth_gbs: float

    @property
    def step_s(self) -> float:
        return self.bytes_per_step / (self.bandwidth_gbs * 1e9)

    @property
    def tok_s(self) -> float:
        """Output tokens per second of the whole server (all requests) at the bound."""
        return self.concurrency * self.accepted_per_step / self.step_s

    def label(self) -> str:
        return f"bandwidth roofline at concurrency {self.concurrency}"


def decode_roofline(
    hardware: HardwareProfile | str,
    model: ModelProfile | str = "deepseek-v4-flash",
    *,
    tp: int = 8,
    concurrency: int = 1,
    context_tokens: int = 8192,
    query_tokens: int = 1,
    accepted_per_step: float = 1.0,
) -> Roofline:
    """The bound at ``concurrency`` requests of ``context_tokens`` each; ``query_tokens`` > 1 and
    ``accepted_per_step`` describe speculative verification (2 and about 1.7 for one MTP draft token)."""
    if concurrency < 1 or tp < 1 or query_tokens < 1:
        raise ConfigError("concurrency", concurrency, "concurrency, tp and query_tokens must be >= 1")
    hw = hardware_profile(hardware) if isinstance(hardware, str) else hardware
    m = model_profile(model) if isinstance(model, str) else model
    tokens = concurrency * query_tokens
    experts = distinct_experts(tokens, m.routed_experts, m.experts_per_token)
    weights = m.dense_bytes_per_step + experts * m.expert_bytes / tp * m.moe_layers
    # The DSV4 KV latent is not sharded by TP: every rank reads every request's cache.
    kv = tokens * (m.kv_read_fixed_bytes + context_tokens * m.kv_read_bytes_per_context_token)
    return Roofline(
        hardware=hw.name,
        model=m.name,
        tp=tp,
        concurrency=concurrency,
        context_tokens=context_tokens,
        query_tokens=query_tokens,
        accepted_per_step=accepted_per_step,
        bytes_per_step=weights + kv,
        bandwidth_gbs=hw.gpu.bandwidth_gbs,
    )
