"""SGLang's GPU memory split, as arithmetic you can check before a launch.

SGLang caps weights + KV pool at ``mem_fraction_static x free-before-load`` and leaves CUDA graphs,
communication buffers, (in older releases) the draft model, and activations to the remainder, which it
never measures before sizing the KV pool. That is why a config can load for minutes and then die in graph
capture — the story's Config B. :func:`preflight` does the same split per GPU and says which phase would
fail and by how much; :func:`suggest` finds the changes that fit with a stated margin.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.config.hardware import HardwareProfile, ModelProfile, hardware_profile, model_profile
from dsv4lab.config.server_config import ServerConfig, SpeculativeConfig
from dsv4lab.config.versions import SGLangRelease, resolve_release
from dsv4lab.counts import plural
from dsv4lab.errors import ConfigError

__all__ = [
    "GPUPrediction",
    "GraphNeed",
    "Preflight",
    "ResolvedSettings",
    "Suggestion",
    "capture_batch_sizes",
    "check_plan",
    "default_mem_fraction_static",
    "graph_needs",
    "preflight",
    "resolve_settings",
    "suggest",
]

#: Default margin a suggestion keeps free after startup, for activations and fragmentation.
DEFAULT_MARGIN_GIB = 4.0

PHASES_IN_ORDER = ("weight_loading", "kv_cache_alloc", "cuda_graph_capture", "draft_cuda_graph_capture")


# -- SGLang's defaults --------------------------------------------------------------------------------------


def _bucket(gpu_gib: float, tp: int, release: SGLangRelease) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) by GPU memory, as SGLang's defaults table gives them."""
    new = release.key >= (0, 5, 16)
    if gpu_gib < 20:
        return 2048, 8
    if gpu_gib < 35:
        return (4096, 48 if tp < 4 else 160) if new else (2048, 24 if tp < 4 else 80)
    if gpu_gib < 60:
        return 4096, 32 if tp < 4 else 160
    if gpu_gib < 160:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def capture_batch_sizes(max_bs: int, speculative: bool) -> tuple[int, ...]:
    """The decode batch sizes SGLang captures by default, up to ``max_bs``."""
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8), *range(272, 4097, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16), *range(512, 4097, 32)]
    kept = [s for s in sizes if s <= max_bs]
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)
    return tuple(kept)


def default_mem_fraction_static(
    gpu_gib: float, tp: int, chunked_prefill_size: int, max_bs: int, speculative: bool, release: SGLangRelease
) -> float:
    """SGLang's heuristic when ``--mem-fraction-static`` is not given (reference sglang.md §8)."""
    gpu_mib = gpu_gib * 1024
    reserved = 512 + max(chunked_prefill_size, 2048) * 1.5 + max_bs * 2 + tp / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    if speculative and release.key < (0, 5, 16):
        reserved += 2048
    return round((gpu_mib - reserved) / gpu_mib, 3)


@dataclass(frozen=True)
class ResolvedSettings:
    """The values SGLang would actually use for the config's unset fields."""

    mem_fraction_static: float
    mem_fraction_is_default: bool
    chunked_prefill_size: int
    max_running_requests: int
    cuda_graph_max_bs: int
    capture_bs: tuple[int, ...]
    speculative: SpeculativeConfig | None


def resolve_settings(
    config: ServerConfig, hardware: HardwareProfile, model: ModelProfile, release: SGLangRelease
) -> ResolvedSettings:
    """What SGLang would pick for the config's unset fields on this hardware and release: the memory split
    depends on those defaults, not on what the config leaves out."""
    gpu_gib = hardware.gpu.total_gib
    chunk_default, bs_default = _bucket(gpu_gib, config.tp, release)
    chunk = config.chunked_prefill_size if config.chunked_prefill_size is not None else chunk_default
    mrr = config.max_running_requests or model.default_max_running_requests
    spec = config.speculative if config.speculative_enabled else None
    if spec is not None and spec.num_steps is None:
        spec = SpeculativeConfig(spec.algorithm, 3, 1, 4, spec.draft_model_path)  # DeepSeek default 3/1/4
    capture: tuple[int, ...] = ()
    if config.disable_cuda_graph:
        max_bs = 0
    elif config.cuda_graph_bs is not None:
        capture = config.cuda_graph_bs
        max_bs = max(capture)
    else:
        max_bs = min(config.cuda_graph_max_bs or bs_default, mrr)
        capture = capture_batch_sizes(max_bs, spec is not None)
    if config.mem_fraction_static is not None:
        f, is_default = config.mem_fraction_static, False
    else:
        f = default_mem_fraction_static(gpu_gib, config.tp, chunk, max_bs, spec is not None, release)
        is_default = True
    return ResolvedSettings(f, is_default, chunk if chunk > 0 else 8192, mrr, max_bs, capture, spec)


# -- graph memory ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphNeed:
    """Memory of one CUDA-graph runner: ``a + b x max_bs x tokens_per_request``."""

    runner: str
    role: str  # "target" or "draft"
    tokens_per_request: int
    max_bs: int
    gib: float


def graph_needs(model: ModelProfile, settings: ResolvedSettings, release: SGLangRelease) -> tuple[GraphNeed, ...]:
    """The CUDA-graph runners a config captures and the memory of each: speculative decoding adds verify and
    draft graphs, which is why Config B runs out of memory where Config A fits."""
    g = model.graphs
    bs = settings.cuda_graph_max_bs
    if bs == 0:
        return ()
    spec = settings.speculative
    if spec is None:
        return (GraphNeed("decode", "target", 1, bs, g.target_a_gib + g.target_b_gib * bs),)
    drafts = spec.num_draft_tokens or 2
    steps = spec.num_steps or 1
    extend_tokens = drafts if release.draft_in_static else steps + 1  # spec v2 sizes extend by draft tokens
    needs = [
        GraphNeed("verify", "target", drafts, bs, g.target_a_gib + g.target_b_gib * bs * drafts),
        GraphNeed(
            "draft_extend", "draft", extend_tokens, bs, g.draft_extend_a_gib + g.draft_extend_b_gib * bs * extend_tokens
        ),
    ]
    if steps > 1:
        topk = spec.eagle_topk or 1
        needs.append(
            GraphNeed("draft_decode", "draft", topk, bs, g.draft_decode_a_gib + g.draft_decode_b_gib * bs * topk)
        )
    return tuple(needs)


# -- preflight ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPUPrediction:
    """What one GPU would hold after startup, in GiB."""

    gpu: int
    free_before_load_gib: float
    weights_gib: float
    draft_weights_gib: float
    kv_pool_gib: float
    slack_gib: float
    comm_gib: float
    graphs_gib: float
    draft_kv_gib: float
    headroom_gib: float
    activation_gib: float
    fail_phase: str | None
    short_by_gib: float | None

    @property
    def fits(self) -> bool:
        return self.fail_phase is None


@dataclass(frozen=True)
class Preflight:
    """A prediction of how a config's startup goes on a host, with the arithmetic to show for it."""

    config: ServerConfig
    hardware: str
    model: str
    sglang_version: str
    settings: ResolvedSettings
    kv_tokens: int
    graphs: tuple[GraphNeed, ...]
    per_gpu: tuple[GPUPrediction, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return all(g.fits for g in self.per_gpu)

    @property
    def failing_gpu(self) -> GPUPrediction | None:
        failing = [g for g in self.per_gpu if not g.fits]
        if not failing:
            return None
        # The first phase reached wins; within it, the GPU short by the most.
        return min(failing, key=lambda g: (PHASES_IN_ORDER.index(g.fail_phase or ""), -(g.short_by_gib or 0.0)))

    @property
    def fail_phase(self) -> str | None:
        g = self.failing_gpu
        return g.fail_phase if g else None

    @property
    def short_by_gib(self) -> float | None:
        g = self.failing_gpu
        return g.short_by_gib if g else None

    @property
    def min_headroom_gib(self) -> float:
        return min(g.headroom_gib for g in self.per_gpu)

    @property
    def runtime_risk(self) -> bool:
        """Starts, but the first large prefill may not find room for its activations."""
        return self.fits and any(g.headroom_gib < g.activation_gib for g in self.per_gpu)

    def explain(self) -> str:
        """The split in words and numbers, for reports and the CLI."""
        s = self.settings
        worst = min(self.per_gpu, key=lambda g: g.slack_gib)
        f = s.mem_fraction_static
        lines = [
            f"mem_fraction_static {f:.2f}{' (SGLang default)' if s.mem_fraction_is_default else ''}: "
            f"weights + KV are capped at {f:.2f} x {worst.free_before_load_gib:.2f} GiB free before load "
            f"(GPU {worst.gpu}, the least free); graphs and buffers must fit in the rest, "
            f"{1 - f:.2f} x {worst.free_before_load_gib:.2f} = {worst.slack_gib:.2f} GiB.",
            f"Per GPU: weights {worst.weights_gib:.2f} GiB"
            + (f" + draft {worst.draft_weights_gib:.2f} GiB" if worst.draft_weights_gib else "")
            + f", KV pool {worst.kv_pool_gib:.2f} GiB ({self.kv_tokens:,} tokens).",
        ]
        for g in self.graphs:
            lines.append(
                f"{g.role} {g.runner} graphs: max bs {g.max_bs} x {plural(g.tokens_per_request, 'token')} per request "
                f"-> {g.gib:.2f} GiB."
            )
        need = (
            worst.comm_gib
            + worst.graphs_gib
            + worst.draft_kv_gib
            + (worst.draft_weights_gib if not _draft_in_static(self) else 0.0)
        )
        lines.append(
            f"Need in the slack: {need:.2f} GiB (graphs {worst.graphs_gib:.2f} + buffers {worst.comm_gib:.2f}"
            + (f" + draft {worst.draft_weights_gib + worst.draft_kv_gib:.2f}" if not _draft_in_static(self) else "")
            + f") against {worst.slack_gib:.2f} GiB."
        )
        failing = self.failing_gpu
        if failing is not None:
            lines.append(
                f"Predicted: OOM in {failing.fail_phase} on GPU {failing.gpu}, short by {failing.short_by_gib:.2f} GiB."
            )
        else:
            lines.append(
                f"Predicted: fits; {self.min_headroom_gib:.2f} GiB left on the tightest GPU for activations "
                f"(about {worst.activation_gib:.2f} GiB at chunked prefill {s.chunked_prefill_size})."
            )
        lines.extend(self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "fits": self.fits,
            "fail_phase": self.fail_phase,
            "short_by_gib": _r(self.short_by_gib),
            "failing_gpu": self.failing_gpu.gpu if self.failing_gpu else None,
            "hardware": self.hardware,
            "model": self.model,
            "sglang_version": self.sglang_version,
            "mem_fraction_static": self.settings.mem_fraction_static,
            "cuda_graph_max_bs": self.settings.cuda_graph_max_bs,
            "kv_tokens": self.kv_tokens,
            "graphs": [
                {
                    "runner": g.runner,
                    "role": g.role,
                    "tokens_per_request": g.tokens_per_request,
                    "max_bs": g.max_bs,
                    "gib": _r(g.gib),
                }
                for g in self.graphs
            ],
            "per_gpu": [
                {
                    "gpu": g.gpu,
                    "free_before_load_gib": _r(g.free_before_load_gib),
                    "weights_gib": _r(g.weights_gib),
                    "draft_weights_gib": _r(g.draft_weights_gib),
                    "kv_pool_gib": _r(g.kv_pool_gib),
                    "slack_gib": _r(g.slack_gib),
                    "graphs_gib": _r(g.graphs_gib),
                    "comm_gib": _r(g.comm_gib),
                    "headroom_gib": _r(g.headroom_gib),
                    "fits": g.fits,
                    "fail_phase": g.fail_phase,
                    "short_by_gib": _r(g.short_by_gib),
                }
                for g in self.per_gpu
            ],
            "explanation": self.explain(),
        }

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        rows = [
            {
                "GPU": g.gpu,
                "free before load (GiB)": g.free_before_load_gib,
                "weights (GiB)": g.weights_gib + g.draft_weights_gib,
                "KV pool (GiB)": g.kv_pool_gib,
                "slack (GiB)": g.slack_gib,
                "graphs + buffers (GiB)": g.graphs_gib + g.comm_gib,
                "headroom (GiB)": g.headroom_gib,
                "verdict": "fits" if g.fits else f"OOM in {g.fail_phase}",
            }
            for g in self.per_gpu
        ]
        if self.fits:
            status, state = f"fits, {self.min_headroom_gib:.1f} GiB to spare", "ok"
        else:
            gpu = self.failing_gpu.gpu if self.failing_gpu is not None else "?"
            status, state = f"OOM in {self.fail_phase} on GPU {gpu}, short by {self.short_by_gib or 0:.1f} GiB", "fail"
        head = hv.p(f"{self.hardware}, {self.model}, SGLang {self.sglang_version}; KV pool {self.kv_tokens:,} tokens")
        body = (
            head + hv.table(rows, max_rows=8) + hv.fold(self.explain().splitlines(), keep=4, summary="the arithmetic")
        )
        return hv.card(f"memory preflight: {self.checked()}", body, state=state, status=status)  # type: ignore[arg-type]

    def checked(self) -> str:
        """What the preflight checked, in one phrase: ``mem_fraction_static 0.70, CUDA graphs up to batch
        256 (SGLang's default cap)``."""
        s = self.settings
        fraction = f"mem_fraction_static {s.mem_fraction_static:.2f}" + (
            " (SGLang's default)" if s.mem_fraction_is_default else ""
        )
        if not self.graphs:
            return f"{fraction}, no CUDA graphs"
        top = max(g.max_bs for g in self.graphs)
        cap = "" if s.cuda_graph_max_bs else " (SGLang's default cap)"
        return f"{fraction}, CUDA graphs up to batch {top}{cap}"


def _draft_in_static(p: Preflight) -> bool:
    return resolve_release(p.sglang_version, warn=False).draft_in_static


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def _as_profiles(
    hardware: HardwareProfile | str, model: ModelProfile | str | None, config: ServerConfig
) -> tuple[HardwareProfile, ModelProfile]:
    hw = hardware_profile(hardware) if isinstance(hardware, str) else hardware
    if model is None:
        m = model_profile(config.model_path)
    else:
        m = model_profile(model) if isinstance(model, str) else model
    return hw, m


def preflight(
    config: ServerConfig,
    hardware: HardwareProfile | str = "rtx-pro-6000-x8",
    model: ModelProfile | str | None = None,
    *,
    sglang_version: str | SGLangRelease | None = None,
) -> Preflight:
    """Predict the startup of ``config`` on ``hardware``: per-GPU split, fits or not, where and by how much."""
    hw, m = _as_profiles(hardware, model, config)
    release = resolve_release(sglang_version, warn=False)
    m.check_tp(config.tp, dp=config.dp, dp_attention="--enable-dp-attention" in config.extra_args)
    gpus_needed = config.tp * config.dp // config.nnodes
    if gpus_needed > hw.count:
        raise ConfigError(
            "tp",
            config.tp,
            f"at most {plural(hw.count, 'GPU')} per node on {hw.name} (tp x dp / nnodes = {gpus_needed})",
        )
    s = resolve_settings(config, hw, m, release)
    spec = s.speculative is not None
    free = hw.free_before_load_gib()[:gpus_needed]
    weights = m.weights_gib(config.tp)
    draft_w = m.draft_weights_gib(config.tp) if spec else 0.0
    static_draft = draft_w if release.draft_in_static else 0.0
    pre = min(free)
    avail = min(f - weights - static_draft for f in free)
    rest = avail - pre * (1 - s.mem_fraction_static)
    state_gib = (s.max_running_requests + 1) * m.per_request_state_mib * (2 if spec else 1) / 1024
    bytes_per_token = m.kv_bytes_per_token_spec if spec and release.draft_in_static else m.kv_bytes_per_token
    kv_tokens = max(0, int((rest - state_gib) * 1024**3 // bytes_per_token))
    graphs = graph_needs(m, s, release)
    target_gib = sum(g.gib for g in graphs if g.role == "target")
    draft_graph_gib = sum(g.gib for g in graphs if g.role == "draft")
    draft_kv = 0.0
    if spec and not release.draft_in_static:
        draft_kv = kv_tokens * m.kv_bytes_per_token / m.layers / 1024**3  # one NextN layer's own pool
    activation = s.chunked_prefill_size / 1024 * m.graphs.activation_gib_per_1k_tokens
    comm = m.graphs.comm_gib if s.cuda_graph_max_bs else m.graphs.comm_gib / 2
    preds = []
    for i, f in enumerate(free):
        after_weights = f - weights - static_draft
        fail: str | None = None
        short: float | None = None
        if after_weights <= 0:
            fail, short = "weight_loading", -after_weights
            preds.append(
                GPUPrediction(i, f, weights, draft_w, 0.0, 0.0, comm, 0.0, 0.0, after_weights, activation, fail, short)
            )
            continue
        if rest <= 0:
            fail, short = "kv_cache_alloc", -rest
        slack = after_weights - max(rest, 0.0)
        steps = [("cuda_graph_capture", comm + target_gib), ("draft_cuda_graph_capture", draft_graph_gib)]
        if spec and not release.draft_in_static:
            steps[1] = ("draft_cuda_graph_capture", draft_w + draft_kv + draft_graph_gib)
        used = 0.0
        for phase, gib in steps:
            used += gib
            if fail is None and used > slack:
                fail = phase
        total_need = sum(g for _, g in steps)
        if fail in ("cuda_graph_capture", "draft_cuda_graph_capture"):
            short = total_need - slack
        preds.append(
            GPUPrediction(
                gpu=i,
                free_before_load_gib=f,
                weights_gib=weights,
                draft_weights_gib=draft_w,
                kv_pool_gib=max(rest, 0.0),
                slack_gib=slack,
                comm_gib=comm,
                graphs_gib=target_gib + draft_graph_gib,
                draft_kv_gib=draft_kv,
                headroom_gib=slack - total_need,
                activation_gib=activation,
                fail_phase=fail,
                short_by_gib=short,
            )
        )
    notes: list[str] = []
    if s.mem_fraction_is_default:
        notes.append(f"mem_fraction_static is unset: SGLang's heuristic gives {s.mem_fraction_static:.3f}.")
    return Preflight(config, hw.name, m.name, release.version, s, kv_tokens, graphs, tuple(preds), tuple(notes))


# -- suggest ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Suggestion:
    """A config change predicted to start with ``margin_gib`` to spare and a KV pool big enough."""

    changes: Mapping[str, Any]
    config: ServerConfig
    preflight: Preflight
    why: str

    def as_flags(self, sglang_version: str | None = None) -> str:
        release = resolve_release(sglang_version, warn=False)
        words: list[str] = []
        for name, value in self.changes.items():
            flag = release.flag_for(name) or f"--{name.replace('_', '-')}"
            words += [flag, str(value)]
        return " ".join(words)

    def to_dict(self) -> dict[str, Any]:
        return {"changes": dict(self.changes), "why": self.why, "headroom_gib": _r(self.preflight.min_headroom_gib)}


def check_plan(concurrency: int | None, context_len: int | None, margin_gib: float = DEFAULT_MARGIN_GIB) -> None:
    """The serving plan a suggestion is sized for: each refused by name when it cannot be one."""
    for name, value in (("concurrency", concurrency), ("context_len", context_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(name, value, "an integer >= 1, or unset")
    if not (isinstance(margin_gib, (int, float)) and math.isfinite(margin_gib) and margin_gib >= 0):
        raise ConfigError("margin_gib", margin_gib, "a non-negative number of GiB")


def suggest(
    config: ServerConfig,
    hardware: HardwareProfile | str = "rtx-pro-6000-x8",
    model: ModelProfile | str | None = None,
    *,
    concurrency: int | None = None,
    context_len: int | None = None,
    margin_gib: float = DEFAULT_MARGIN_GIB,
    sglang_version: str | SGLangRelease | None = None,
) -> list[Suggestion]:
    """Changes that fit, best first: cap the captured batch, lower the static fraction, or both.

    ``concurrency`` is the largest number of simultaneous requests you plan to serve: graphs beyond it
    are never replayed, so a cap at the first captured size >= concurrency costs nothing. The KV pool
    must still hold ``concurrency x context_len`` tokens (context defaults to 8,192).
    """
    check_plan(concurrency, context_len, margin_gib)
    hw, m = _as_profiles(hardware, model, config)
    release = resolve_release(sglang_version, warn=False)
    base = preflight(config, hw, m, sglang_version=release)
    s = base.settings
    need_tokens = (concurrency or 1) * (context_len or 8192)

    def ok(p: Preflight) -> bool:
        return p.fits and p.min_headroom_gib >= margin_gib and p.kv_tokens >= need_tokens

    out: list[Suggestion] = []
    if s.cuda_graph_max_bs:
        sizes = capture_batch_sizes(s.cuda_graph_max_bs, s.speculative is not None)
        fitting = [
            bs
            for bs in sizes
            if ok(preflight(config.replace(cuda_graph_max_bs=bs, cuda_graph_bs=None), hw, m, sglang_version=release))
        ]
        if fitting and fitting[-1] < s.cuda_graph_max_bs:
            cap = fitting[-1]
            if concurrency is not None:
                enough = [bs for bs in fitting if bs >= concurrency]
                cap = enough[0] if enough else cap
            c = config.replace(cuda_graph_max_bs=cap, cuda_graph_bs=None)
            p = preflight(c, hw, m, sglang_version=release)
            out.append(
                Suggestion(
                    {"cuda_graph_max_bs": cap},
                    c,
                    p,
                    f"graphs captured up to bs {cap} need {sum(g.gib for g in p.graphs):.2f} GiB instead of "
                    f"{sum(g.gib for g in base.graphs):.2f}; {p.min_headroom_gib:.2f} GiB stays free at "
                    f"mem_fraction_static {s.mem_fraction_static:.2f}"
                    + (f" (concurrency {concurrency} never uses larger graphs)" if concurrency else ""),
                )
            )
    # Lower the fraction, keeping the graphs: the largest f (0.01 steps) that leaves the margin.
    f = math.floor(s.mem_fraction_static * 100) / 100
    while f >= 0.05:
        c = config.replace(mem_fraction_static=round(f, 2))
        p = preflight(c, hw, m, sglang_version=release)
        if p.fits and p.min_headroom_gib >= margin_gib:
            if p.kv_tokens >= need_tokens and round(f, 2) < s.mem_fraction_static:
                out.append(
                    Suggestion(
                        {"mem_fraction_static": round(f, 2)},
                        c,
                        p,
                        f"slack grows to {(1 - f):.2f} x free = {min(g.slack_gib for g in p.per_gpu):.2f} GiB, "
                        f"{p.min_headroom_gib:.2f} GiB left after graphs; KV pool keeps {p.kv_tokens:,} tokens "
                        f"(need {need_tokens:,})",
                    )
                )
            break
        f -= 0.01
    return out
