"""How long a decode step and a prefill take: a roofline-style model with the story's sm_120 bottleneck.

One decode step over B requests with q query tokens each (q = 1, or the draft tokens under speculative
verification) costs

    t = floor + dense_bytes / (BW x eff)
          + E_distinct(B x q) x expert_bytes / tp x moe_layers / (BW x eff)
          + q x sum over requests of (kv_read_fixed + ctx x kv_read_per_ctx) / attention_gbs
          + 2 x layers x allreduce  (+ draft_step x num_steps under speculation)

with ``E_distinct(T) = N (1 - (1 - k/N)^T)`` distinct routed experts touched per layer, all times the
untuned-FP8 penalty when no tuned block-GEMM JSON was found. On sm_120 ``attention_gbs`` is the slow
fallback sparse-MLA kernel, which is why attention is ~63 % of GPU time at the story's load and why
speculation (which doubles the query tokens) stops paying at concurrency 16.

Story workload used for calibration (rtx-pro-6000-x8 coefficients in ``dsv4lab.config.hardware``): decode at
about 8K tokens of context per request (prompts of 8,000 tokens, short outputs); Config A decodes about
23 tok/s in total at concurrency 16; Config B-fixed is about +47 % at concurrency 1 and level with A at 16.
Running a step without a captured CUDA graph (batch larger than the largest captured size, or graphs
disabled) doubles the per-step floor (kernel launch overhead): a twin estimate.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from dsv4lab.config.hardware import HardwareProfile, ModelProfile
from dsv4lab.config.server_config import SpeculativeConfig

__all__ = ["EAGER_FLOOR_FACTOR", "SpeedDrift", "StepCost", "TimingModel", "distinct_experts"]

#: How much longer a step's fixed launch overhead is without CUDA graphs (every kernel launched one by one).
EAGER_FLOOR_FACTOR = 2.0


def distinct_experts(tokens: int, routed: int, top_k: int) -> float:
    """Expected distinct experts per layer touched by ``tokens`` tokens under uniform top-k routing."""
    if tokens <= 0:
        return 0.0
    return routed * (1.0 - (1.0 - top_k / routed) ** tokens)


@dataclass(frozen=True)
class StepCost:
    """One decode step's time split by kind of kernel (seconds, at time scale 1, penalty included)."""

    floor_s: float
    dense_s: float
    moe_s: float
    attention_s: float
    allreduce_s: float
    draft_s: float

    @property
    def total_s(self) -> float:
        return self.floor_s + self.dense_s + self.moe_s + self.attention_s + self.allreduce_s + self.draft_s

    def shares(self) -> dict[str, float]:
        t = self.total_s or 1.0
        return {
            "attention": self.attention_s / t,
            "moe": self.moe_s / t,
            "dense": self.dense_s / t,
            "allreduce": self.allreduce_s / t,
            "draft": self.draft_s / t,
            "other": self.floor_s / t,
        }


@dataclass(frozen=True)
class TimingModel:
    """How long a decode step or a prefill takes for this model, hardware and config: the roofline-style
    costs the twin sleeps for, so throughput emerges from the config instead of being typed in."""

    hardware: HardwareProfile
    model: ModelProfile
    tp: int
    speculative: SpeculativeConfig | None
    tuned_fp8: bool

    @property
    def query_tokens(self) -> int:
        """Query tokens per request per step: 1, or the verified draft tokens under speculation."""
        if self.speculative is None:
            return 1
        return self.speculative.num_draft_tokens or 2

    @property
    def penalty(self) -> float:
        return 1.0 if self.tuned_fp8 else self.hardware.timing.untuned_fp8_penalty

    def decode_step(self, batch: int, context_tokens: int, *, cuda_graph: bool = True) -> StepCost:
        """Cost of one step over ``batch`` requests holding ``context_tokens`` tokens of context in total."""
        tc = self.hardware.timing
        m = self.model
        q = self.query_tokens
        bw = self.hardware.gpu.bandwidth_gbs * 1e9 * tc.weight_efficiency
        floor = tc.floor_s * (1.0 if cuda_graph else EAGER_FLOOR_FACTOR)
        dense = m.dense_bytes_per_step / bw
        experts = distinct_experts(batch * q, m.routed_experts, m.experts_per_token)
        moe = experts * m.expert_bytes / self.tp * m.moe_layers / bw
        kv_bytes = q * (batch * m.kv_read_fixed_bytes + context_tokens * m.kv_read_bytes_per_context_token)
        attention = kv_bytes / (tc.attention_gbs * 1e9)
        allreduce = 2 * m.layers * tc.allreduce_s
        draft = tc.draft_step_s * (self.speculative.num_steps or 1) if self.speculative is not None else 0.0
        p = self.penalty
        return StepCost(floor * p, dense * p, moe * p, attention * p, allreduce * p, draft * p)

    def prefill_s(self, tokens: int) -> float:
        """A prefill batch of ``tokens`` new tokens (TTFT's main term)."""
        tc = self.hardware.timing
        return tc.floor_s + tokens / tc.prefill_tokens_per_s * self.penalty


class SpeedDrift:
    """A slowly wandering speed factor (Ornstein-Uhlenbeck in log space), seeded for reproducibility.

    ``factor(dt)`` advances the process by ``dt`` modelled seconds and returns the multiplier for the
    next step's duration; its stationary coefficient of variation is ``cv``, its memory ``tau_s``.
    """

    def __init__(self, cv: float, tau_s: float, seed: int | str) -> None:
        self._sigma = math.log1p(cv) if cv > 0 else 0.0
        self._tau = max(tau_s, 1e-6)
        self._rng = random.Random(seed)
        self._x = self._rng.gauss(0.0, self._sigma) if self._sigma else 0.0

    def factor(self, dt_s: float) -> float:
        if not self._sigma:
            return 1.0
        decay = math.exp(-max(dt_s, 0.0) / self._tau)
        self._x = self._x * decay + self._sigma * math.sqrt(1.0 - decay * decay) * self._rng.gauss(0.0, 1.0)
        return math.exp(self._x - self._sigma * self._sigma / 2)
