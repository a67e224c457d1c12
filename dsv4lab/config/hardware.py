"""GPU hosts and models as data: one source of truth for the memory model, the twin and preflight.

Figures marked [F] in ``reference/memory.md`` are facts (card capacity, bandwidth, model dimensions);
the graph-memory and timing coefficients are estimates calibrated so that the model reproduces the
story's observations on 8x RTX PRO 6000 (Config A fits at 0.70, Config B dies in graph capture about
20 GiB short, Config A decodes about 23 tok/s at concurrency 16). ``memory.calibrate`` replaces the
graph coefficients with ones fitted to a real log.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from dsv4lab.errors import ConfigError, UnknownNameError

__all__ = [
    "HARDWARE",
    "MODELS",
    "GPUSpec",
    "GraphCoefficients",
    "HardwareProfile",
    "ModelProfile",
    "TimingCoefficients",
    "hardware_profile",
    "known_model",
    "model_profile",
]

MIB = 1024**2
GIB = 1024**3


@dataclass(frozen=True)
class GPUSpec:
    """One GPU model as nvidia-smi and the datasheet describe it."""

    name: str
    total_mib: int
    bandwidth_gbs: float
    sm: str
    interconnect: str

    @property
    def total_gib(self) -> float:
        return self.total_mib / 1024


@dataclass(frozen=True)
class TimingCoefficients:
    """Decode-step cost terms for the twin's roofline-style timing model (calibrated estimates).

    A step costs ``floor_s`` plus weight bytes over ``bandwidth x weight_efficiency`` plus, per query
    token, the sparse-MLA KV bytes over ``attention_gbs`` (the sm_120 fallback kernel is orders of
    magnitude below the memory roofline, which is the story's bottleneck), plus one all-reduce pair per
    layer, plus the draft model under speculation.
    """

    floor_s: float
    weight_efficiency: float
    attention_gbs: float
    allreduce_s: float
    draft_step_s: float
    #: Multiplier on the step when no tuned FP8 block-GEMM config is installed for this GPU.
    untuned_fp8_penalty: float = 1.06
    #: Prefill throughput per GPU group, tokens/s, for TTFT.
    prefill_tokens_per_s: float = 7000.0
    #: Slow drift of the whole GPU group's speed (clocks, thermals, PCIe contention): coefficient of
    #: variation and correlation time in modelled seconds. Real runs differ by a few percent run to run;
    #: without it an A/B on the twin would call a 0.5% difference significant.
    speed_drift_cv: float = 0.02
    speed_drift_tau_s: float = 30.0


@dataclass(frozen=True)
class HardwareProfile:
    """A host: ``count`` identical GPUs, each with a little memory already in use by others.

    ``other_used_gib`` differs per GPU on purpose: SGLang sizes every rank from the *minimum* free memory,
    so the GPU with the most foreign use (here GPU 1, as in the story) is the one that runs out first.
    """

    name: str
    description: str
    gpu: GPUSpec
    count: int
    #: CUDA context, NCCL and custom all-reduce buffers per GPU before weights load.
    context_overhead_gib: float
    other_used_gib: tuple[float, ...]
    timing: TimingCoefficients

    def free_before_load_gib(self) -> tuple[float, ...]:
        """Free memory per GPU when SGLang measures it, before weights."""
        base = self.gpu.total_gib - self.context_overhead_gib
        return tuple(round(base - used, 4) for used in self.other_used_gib)

    def gpu_name_as_file(self) -> str:
        """The device name as SGLang puts it in kernel-config file names."""
        return self.gpu.name.replace(" ", "_")

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        g = self.gpu
        spec = f"{g.name} ({g.sm}, {g.total_gib:.1f} GiB, {g.bandwidth_gbs:,.0f} GB/s, {g.interconnect})"
        facts: list[tuple[str, object]] = [
            ("GPUs", f"{self.count} x {spec}"),
            ("context + buffers per GPU", f"{self.context_overhead_gib:.2f} GiB"),
            ("used by others per GPU", ", ".join(f"{x:.2f}" for x in self.other_used_gib) + " GiB"),
            ("free before weights", ", ".join(f"{x:.2f}" for x in self.free_before_load_gib()) + " GiB"),
        ]
        return hv.card(f"hardware {self.name}", hv.p(self.description) + hv.kv_table(facts))


@dataclass(frozen=True)
class GraphCoefficients:
    """CUDA-graph memory per runner: ``a + b x max_bs x tokens_per_request`` GiB.

    Runners: the target's decode graph (verify under speculation, sized by draft tokens), the draft's
    extend graph and, only when ``num_steps > 1``, the draft's decode graph.
    """

    target_a_gib: float
    target_b_gib: float
    draft_extend_a_gib: float
    draft_extend_b_gib: float
    draft_decode_a_gib: float
    draft_decode_b_gib: float
    #: NCCL / custom all-reduce / workspace buffers that come out of the slack at capture time.
    comm_gib: float
    #: Activation peak per 1,024 prefill tokens (chunked prefill), for runtime headroom.
    activation_gib_per_1k_tokens: float


@dataclass(frozen=True)
class ModelProfile:
    """A model's memory and traffic figures as SGLang sizes them."""

    name: str
    hf_id: str
    layers: int
    #: Weights per GPU at TP=1; divided by TP except the replicated part.
    sharded_weights_gib: float
    replicated_weights_gib: float
    draft_weights_gib_per_gpu_at_tp8: float
    kv_bytes_per_token: float
    kv_bytes_per_token_spec: float
    #: Fixed per-request-slot state (DSV4 c128 compressor ring), MiB; doubled under speculation.
    per_request_state_mib: float
    default_max_running_requests: int
    default_context_length: int
    graphs: GraphCoefficients
    # Traffic per decode step (timing model).
    routed_experts: int
    experts_per_token: int
    expert_bytes: float
    moe_layers: int
    dense_bytes_per_step: float
    kv_read_fixed_bytes: float
    kv_read_bytes_per_context_token: float
    architecture: str = ""
    spec_algorithms: tuple[str, ...] = ("EAGLE", "NEXTN", "DSPARK")
    #: Mean tokens accepted per verify step for one draft token (1 + alpha).
    mtp_accept_mean: float = 1.7
    #: Attention heads [F]: SGLang shards them evenly over the TP ranks, so tp must divide them (0 = unknown).
    attention_heads: int = 0

    def weights_gib(self, tp: int) -> float:
        return self.sharded_weights_gib / tp + self.replicated_weights_gib

    def draft_weights_gib(self, tp: int) -> float:
        return self.draft_weights_gib_per_gpu_at_tp8 * 8 / tp

    def with_graphs(self, graphs: GraphCoefficients) -> ModelProfile:
        return replace(self, graphs=graphs)

    def check_tp(self, tp: int, *, dp: int = 1, dp_attention: bool = False) -> None:
        """Refuse a tp whose attention ranks do not divide the heads, with SGLang's reason.

        SGLang shards the attention heads evenly over the attention tensor-parallel ranks (tp, or tp/dp
        with ``--enable-dp-attention``) and stops at weight loading when they do not divide; checking it
        here turns tp=3 on a 128-head model into an error before anything is launched.
        """
        heads = self.attention_heads
        attn_tp = tp // dp if dp_attention and dp > 0 and tp % dp == 0 else tp
        if not heads or attn_tp < 1 or heads % attn_tp == 0:
            return
        ok = ", ".join(str(n) for n in range(1, heads + 1) if heads % n == 0)
        what = "tp / dp (the attention TP with --enable-dp-attention)" if dp_attention else "tp"
        raise ConfigError(
            "tp",
            tp,
            f"a {what} that divides the {heads} attention heads of {self.name}: {ok}",
            detail=f"SGLang shards the attention heads evenly over the tensor-parallel ranks; {heads} heads do "
            f"not split over {attn_tp}",
        )


RTX_PRO_6000 = GPUSpec(
    name="NVIDIA RTX PRO 6000 Blackwell Server Edition",
    total_mib=97_887,
    bandwidth_gbs=1_597.0,
    sm="sm_120",
    interconnect="PCIe Gen5 x16, no NVLink",
)
H200 = GPUSpec(
    name="NVIDIA H200",
    total_mib=143_771,
    bandwidth_gbs=4_800.0,
    sm="sm_90",
    interconnect="NVLink 4, 900 GB/s",
)

#: The GPU hosts preflight and the twin know, by name: one table, so both model the same machine.
HARDWARE: dict[str, HardwareProfile] = {
    "rtx-pro-6000-x8": HardwareProfile(
        name="rtx-pro-6000-x8",
        description="8x RTX PRO 6000 Blackwell Server Edition (sm_120, 96 GB, PCIe): the story's host",
        gpu=RTX_PRO_6000,
        count=8,
        context_overhead_gib=1.0,
        # GPU 1 carries a little foreign use (a display or monitoring context): it is the one that OOMs.
        other_used_gib=(0.02, 0.35, 0.05, 0.03, 0.06, 0.02, 0.04, 0.05),
        timing=TimingCoefficients(
            floor_s=0.1686,
            weight_efficiency=0.0532,
            attention_gbs=0.58,
            allreduce_s=40e-6,
            draft_step_s=0.0023,
        ),
    ),
    "h200-x8": HardwareProfile(
        name="h200-x8",
        description="8x H200 (sm_90, 141 GB HBM3e, NVLink): FlashMLA and tuned kernels available",
        gpu=H200,
        count=8,
        context_overhead_gib=1.2,
        other_used_gib=(0.0, 0.02, 0.0, 0.01, 0.0, 0.03, 0.0, 0.01),
        timing=TimingCoefficients(
            floor_s=0.006,
            weight_efficiency=0.55,
            attention_gbs=2_400.0,
            allreduce_s=12e-6,
            draft_step_s=0.0008,
            untuned_fp8_penalty=1.02,
            prefill_tokens_per_s=30_000.0,
        ),
    ),
    "tiny": HardwareProfile(
        name="tiny",
        description="2x a small 24 GB GPU with a fast made-up timing model: for tests",
        gpu=GPUSpec(name="dsv4lab tiny GPU", total_mib=24_576, bandwidth_gbs=1_000.0, sm="sm_89", interconnect="PCIe"),
        count=2,
        context_overhead_gib=0.5,
        other_used_gib=(0.0, 0.1),
        timing=TimingCoefficients(
            floor_s=0.002,
            weight_efficiency=0.5,
            attention_gbs=500.0,
            allreduce_s=5e-6,
            draft_step_s=0.0005,
            prefill_tokens_per_s=200_000.0,
        ),
    ),
}

_DSV4_GRAPHS = GraphCoefficients(
    target_a_gib=1.5,
    target_b_gib=0.070,
    draft_extend_a_gib=0.5,
    draft_extend_b_gib=0.0185,
    draft_decode_a_gib=0.3,
    draft_decode_b_gib=0.010,
    comm_gib=1.0,
    activation_gib_per_1k_tokens=0.3,
)

#: The models whose memory and timing dsv4lab models, by name (a config's ``model_path`` is matched to one).
MODELS: dict[str, ModelProfile] = {
    "deepseek-v4-flash": ModelProfile(
        name="deepseek-v4-flash",
        hf_id="deepseek-ai/DeepSeek-V4-Flash",
        architecture="DeepseekV4ForCausalLM",
        layers=43,
        # 18.7 GiB per GPU at TP8 with MXFP4 experts sharded and attention projections replicated.
        sharded_weights_gib=129.6,
        replicated_weights_gib=2.5,
        draft_weights_gib_per_gpu_at_tp8=0.42,
        kv_bytes_per_token=7_705.0,
        kv_bytes_per_token_spec=9_260.0,
        per_request_state_mib=10.0,
        default_max_running_requests=256,
        default_context_length=1_048_576,
        graphs=_DSV4_GRAPHS,
        routed_experts=256,
        experts_per_token=6,
        expert_bytes=13.37e6,
        moe_layers=43,
        dense_bytes_per_step=1.5e9,
        kv_read_fixed_bytes=43 * 128 * 584 + 512 * 584 * 21,
        kv_read_bytes_per_context_token=132 / 4 * 21 + 584 / 128 * 20,
        attention_heads=128,
    ),
    "tiny-moe": ModelProfile(
        name="tiny-moe",
        hf_id="dsv4lab/tiny-moe",
        architecture="DeepseekV4ForCausalLM",
        layers=4,
        sharded_weights_gib=6.0,
        replicated_weights_gib=0.5,
        draft_weights_gib_per_gpu_at_tp8=0.05,
        kv_bytes_per_token=2_048.0,
        kv_bytes_per_token_spec=2_560.0,
        per_request_state_mib=1.0,
        default_max_running_requests=256,
        default_context_length=32_768,
        graphs=GraphCoefficients(0.2, 0.004, 0.1, 0.001, 0.05, 0.001, 0.3, 0.05),
        routed_experts=16,
        experts_per_token=2,
        expert_bytes=2e6,
        moe_layers=4,
        dense_bytes_per_step=5e7,
        kv_read_fixed_bytes=1e5,
        kv_read_bytes_per_context_token=50.0,
        attention_heads=16,
    ),
}

_MODEL_ALIASES = {m.hf_id.lower(): m.name for m in MODELS.values()}


def hardware_profile(name: str) -> HardwareProfile:
    """The profile called ``name`` (:data:`HARDWARE`); a typo is an :class:`~dsv4lab.errors.UnknownNameError`
    offering the nearest name, since preflight and the twin must agree on one machine."""
    try:
        return HARDWARE[name]
    except KeyError:
        raise UnknownNameError("hardware profile", name, HARDWARE, field="hardware") from None


def known_model(name_or_path: str) -> ModelProfile | None:
    """The profile of a model path if dsv4lab knows the model, else None (any other model is allowed)."""
    try:
        return model_profile(name_or_path)
    except ConfigError:
        return None


def model_profile(name_or_path: str) -> ModelProfile:
    """A model profile by profile name, Hugging Face id, or a path ending in the model's name."""
    key = name_or_path.strip().rstrip("/").lower()
    if key in MODELS:
        return MODELS[key]
    if key in _MODEL_ALIASES:
        return MODELS[_MODEL_ALIASES[key]]
    tail = key.rsplit("/", 1)[-1]
    for m in MODELS.values():
        if tail in (m.name, m.hf_id.lower().rsplit("/", 1)[-1]):
            return m
    raise UnknownNameError(
        "model",
        name_or_path,
        [m.hf_id for m in MODELS.values()],
        also="a path ending in one of their names",
    )
