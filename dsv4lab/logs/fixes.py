"""Ranked fixes for a failed launch, with the arithmetic done on the log's own numbers.

A fix that only says "lower --mem-fraction-static" sends the user into a five-minute trial-and-error loop
per guess. Here every memory fix shows the split the log implies: SGLang sizes weights + KV inside
``f × free-before-load`` and leaves CUDA graphs, activations and NCCL buffers the rest, so a capture OOM
means *lower* f (or capture smaller graphs) and a KV budget <= 0 means *raise* f (or need less KV). vLLM
caps everything with ``gpu_memory_utilization``. Non-memory failures get the fix for their cause, never a
memory knob.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dsv4lab.counts import plural
from dsv4lab.logs.events import Engine, ErrorKind, OomFigures, Phase
from dsv4lab.logs.patterns import VLLM_FREE_ON_START as _FREE_ON_START
from dsv4lab.logs.patterns import VLLM_KV_SPACE as _KV_SPACE
from dsv4lab.logs.patterns import VLLM_MAX_SEQ_LEN as _MAX_SEQ_LEN

__all__ = ["Fix", "MemoryFacts", "fixes_for"]


@dataclass(frozen=True, slots=True)
class Fix:
    """One suggested change (``change``: a flag or an action) and ``why``, with the numbers behind it."""

    change: str
    why: str

    def to_dict(self) -> dict[str, str]:
        return {"change": self.change, "why": self.why}


@dataclass(frozen=True, slots=True)
class MemoryFacts:
    """The memory figures a log gave for the failing rank (or the minimum over ranks), in GiB.

    ``pre`` = free before weights load (SGLang's base for the static fraction), ``post`` = free after
    weights, ``slack_now`` = free once weights + KV were placed (what graphs must fit in).
    """

    pre: float | None = None
    post: float | None = None
    weights: float | None = None
    kv: float | None = None
    slack_now: float | None = None
    capture_avail: float | None = None
    graphs: float | None = None
    runtime_headroom: float | None = None
    fraction: float | None = None  # mem_fraction_static (SGLang) or gpu_memory_utilization (vLLM)
    fraction_from_log: bool = False  # read from server args (True) or inferred from the split (False)
    max_bs: int | None = None
    tp: int | None = None
    context: int | None = None
    kv_dtype: str | None = None
    spec_steps: int | None = None
    spec_draft_tokens: int | None = None
    spec_topk: int | None = None
    new_flags: bool = False  # 0.5.16+ spelling (--cuda-graph-max-bs-decode)
    total: float | None = None  # card capacity when the log states it

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if getattr(self, k) is not None}


def _floor_to(x: float, step: float) -> float:
    return math.floor(x / step + 1e-9) * step


def _ceil_to(x: float, step: float) -> float:
    return math.ceil(x / step - 1e-9) * step


def _graph_flag(m: MemoryFacts) -> str:
    return "--cuda-graph-max-bs-decode" if m.new_flags else "--cuda-graph-max-bs"


def _lower_fraction(m: MemoryFacts, oom: OomFigures | None) -> Fix:
    tried = oom.tried_gib if oom else None
    free = oom.free_gib if oom else None
    need = max((tried or 0.0) - (free or 0.0), 0.0)
    failing = ""
    if tried is not None:
        failing = f" The failing allocation was {tried:.2f} GiB"
        failing += f" with {free:.2f} GiB free." if free is not None else "."
        failing += " It is one allocation, not the whole shortfall: more graphs were still to be captured."
    if m.fraction is not None and m.pre is not None:
        f, pre = m.fraction, m.pre
        slack = (1 - f) * pre
        margin = max(2.0, 0.05 * pre)  # the rest of the capture and the activations still need room
        new_f = _floor_to(f - (need + margin) / pre, 0.05)
        new_f = min(new_f, _floor_to(f - 0.05, 0.05) if f >= 0.1 else f / 2)
        new_f = max(new_f, 0.3)
        new_slack = (1 - new_f) * pre
        src = "" if m.fraction_from_log else " (inferred from the memory left after the KV pool)"
        why = (
            f"CUDA graphs, activations and NCCL buffers must fit in (1 − {f:.2f}){src} × {pre:.1f} GiB free "
            f"before load = {slack:.1f} GiB.{failing} At {new_f:.2f} that share is {new_slack:.1f} GiB "
            f"(+{new_slack - slack:.1f} GiB); the KV pool shrinks by the same amount."
        )
        return Fix(f"--mem-fraction-static {new_f:.2f}", why)
    if m.fraction is not None:
        new_f = max(_floor_to(m.fraction - 0.1, 0.05), 0.3)
        base = m.total
        extra = f" On this {base:.0f} GiB card each 0.05 is about {0.05 * base:.1f} GiB." if base else ""
        why = (
            f"Graphs and activations live outside the static share (1 − f of the free memory before load);"
            f" lowering f from {m.fraction:.2f} to {new_f:.2f} moves memory from the KV pool to them.{failing}{extra}"
        )
        return Fix(f"--mem-fraction-static {new_f:.2f}", why)
    extra = f" On this {m.total:.0f} GiB card each 0.05 is about {0.05 * m.total:.1f} GiB." if m.total else ""
    why = (
        "Graphs and activations live outside the static share (1 − f of the free memory before load); the log "
        f"does not show f, so lower it by about 0.10 from the value used (0.05 steps).{failing}{extra}"
    )
    return Fix("--mem-fraction-static <current − 0.10>", why)


def _lower_graph_bs(m: MemoryFacts) -> Fix:
    flag = _graph_flag(m)
    cur = m.max_bs
    if cur is None:
        return Fix(
            f"{flag} 16",
            "Graph memory grows with the largest captured batch; capping it at 16 captures fewer, smaller graphs "
            "and leaves the KV pool untouched (batches above 16 then run without graphs).",
        )
    new = 16 if cur > 32 else max(1, cur // 2)
    graphs = f" (graphs took {m.graphs:.2f} GiB before the failure)" if m.graphs else ""
    return Fix(
        f"{flag} {new}",
        f"Graphs are captured for batch sizes up to {cur}{graphs}; capping at {new} captures fewer, smaller graphs "
        "and leaves the KV pool untouched (larger batches run without graphs).",
    )


def _raise_fraction(m: MemoryFacts, message: str, engine: Engine | None) -> Fix:
    from dsv4lab.logs.patterns import MIN_VIABLE, RAISE_ABOVE

    if engine is Engine.VLLM:
        cur = m.fraction
        new = min(0.98, _ceil_to((cur or 0.9) + 0.05, 0.01))
        parts = [f"vLLM's cap covers weights, activations, graphs and KV; at {cur:.2f}" if cur else "At the cap used"]
        if m.total is not None and cur is not None:
            parts.append(f" × {m.total:.1f} GiB = {cur * m.total:.1f} GiB")
        if m.weights is not None:
            parts.append(f" the weights alone take {m.weights:.2f} GiB")
        parts.append(f" and nothing is left for KV blocks; {new:.2f} gives the KV cache room.")
        return Fix(f"--gpu-memory-utilization {new:.2f}", "".join(parts))
    suggested: float | None = None
    m_above = RAISE_ABOVE.search(message)
    m_min = MIN_VIABLE.search(message)
    if m_above:
        suggested = float(m_above.group(1))
    elif m_min:
        suggested = float(m_min.group(1))
    min_viable: float | None = None
    if m.pre and m.post is not None:
        min_viable = 1 - m.post / m.pre
    floor = suggested if suggested is not None else min_viable
    if floor is not None:
        new = min(0.97, _ceil_to(floor + 0.05, 0.01))
        if m.fraction is not None and new <= m.fraction:
            new = min(0.97, _ceil_to(m.fraction + 0.03, 0.01))
    else:
        new = min(0.97, _ceil_to((m.fraction or 0.85) + 0.05, 0.01))
    why: str
    if m.pre is not None and m.post is not None:
        w = m.weights if m.weights is not None else m.pre - m.post
        f_txt = f"{m.fraction:.2f}" if m.fraction is not None else "f"
        kv_now = f" = {m.post - (1 - m.fraction) * m.pre:.1f} GiB" if m.fraction is not None else ""
        why = (
            f"The weights take {w:.1f} GiB of {m.pre:.1f} GiB free before load, leaving {m.post:.1f} GiB; the KV "
            f"pool gets {m.post:.1f} − (1 − {f_txt}) × {m.pre:.1f}{kv_now}, which must be > 0: the minimum viable "
            f"fraction is 1 − {m.post:.1f}/{m.pre:.1f} = {1 - m.post / m.pre:.3f}. At {new:.2f} the KV pool gets "
            f"{m.post - (1 - new) * m.pre:.1f} GiB and graphs keep {(1 - new) * m.pre:.1f} GiB."
        )
    elif suggested is not None:
        why = f"SGLang reports the KV budget is <= 0 and names {suggested:.3f} as the least fraction that gives one."
    elif m.post is not None:
        why = (
            f"Only {m.post:.1f} GiB was free after the weights loaded and the static share left no KV budget; "
            "raise the fraction (graphs and activations then get less, so keep the graph max bs modest)."
        )
    else:
        why = "The KV pool budget (f × free-before-load − weights) came out <= 0; a larger f gives it memory."
    if new >= 0.95:
        why += " That leaves little for graphs: prefer fewer weights per GPU (more GPUs or a quantized checkpoint)."
    return Fix(f"--mem-fraction-static {new:.2f}", why)


def _more_gpus(m: MemoryFacts, what: str, engine: Engine | None = None) -> Fix:
    tp = m.tp or 1
    w = f" ({m.weights:.1f} GiB per GPU now)" if m.weights else ""
    why = f"Splitting the weights over {plural(tp * 2, 'GPU')} halves them per GPU{w}; {what}"
    flag = "--tensor-parallel-size" if engine is Engine.VLLM else "--tp-size"
    return Fix(f"{flag} {tp * 2}", why)


def _vllm_max_seq_len_fixes(m: MemoryFacts, message: str) -> list[Fix] | None:
    """vLLM's refusal of a KV cache too small for one ``max_model_len`` request: its own estimate of the
    longest context that fits first, then a KV space that serves the asked one; None for other refusals."""
    seq = _MAX_SEQ_LEN.search(message)
    if seq is None:
        return None
    length, need, have = int(seq["len"]), float(seq["need"]), float(seq["have"])
    fixes: list[Fix] = []
    if seq["est"]:
        est = int(seq["est"])
        fixes.append(
            Fix(
                f"--max-model-len {est}",
                f"vLLM's own estimate: the longest context whose KV blocks fit in the {have:.2f} GiB it has; one "
                f"request of {length:,} tokens needs {need:.2f} GiB.",
            )
        )
    space = math.ceil(need + 0.01)
    fixes.append(
        Fix(
            f"VLLM_CPU_KVCACHE_SPACE={space} on the CPU backend (a higher --gpu-memory-utilization on a GPU)",
            f"Keeps max_model_len {length:,}: the KV cache needs {need:.2f} GiB for one request and has {have:.2f}; "
            "on a CPU host it is VLLM_CPU_KVCACHE_SPACE (whole GiB) that sizes it.",
        )
    )
    if not (m.kv_dtype or "").startswith("fp8"):
        fixes.append(
            Fix(
                "--kv-cache-dtype fp8",
                "An FP8 KV cache halves bytes per token, so the same space holds about twice the context.",
            )
        )
    return fixes


def _memory_fixes(
    engine: Engine | None, phase: Phase | None, kind: ErrorKind, m: MemoryFacts, oom: OomFigures | None, message: str
) -> list[Fix]:
    fixes: list[Fix] = []
    vllm = engine is Engine.VLLM
    space = _KV_SPACE.search(message) if kind is ErrorKind.KV_BUDGET else None
    if space:
        free, asked = float(space.group(1)), float(space.group(3))
        fit = max(1, math.floor(free * 0.8))
        fixes.append(
            Fix(
                f"VLLM_CPU_KVCACHE_SPACE={fit} (or --kv-cache-memory-bytes below {free:.0f} GiB)",
                f"The KV space asked for ({asked:.1f} GiB) must fit in the {free:.2f} GiB the memory node has "
                f"available; {fit} GiB leaves the rest for the model and activations.",
            )
        )
        fixes.append(
            Fix(
                "free host RAM on the node (other processes, page cache held by containers)",
                "vLLM measures the node's available memory (MemFree plus reclaimable) before sizing the cache.",
            )
        )
        return fixes
    if kind is ErrorKind.KV_BUDGET and vllm:
        seq_fixes = _vllm_max_seq_len_fixes(m, message)
        if seq_fixes is not None:
            return seq_fixes
    if kind is ErrorKind.KV_BUDGET:
        fixes.append(_raise_fraction(m, message, engine))
        ctx = f" ({m.context} tokens now)" if m.context else ""
        fixes.append(
            Fix(
                "--max-model-len <shorter>" if vllm else "--context-length <shorter>",
                f"A shorter context needs fewer KV tokens per request{ctx}; the pool itself does not shrink, but "
                "the engine's minimum (one full-length request) does.",
            )
        )
        if not (m.kv_dtype or "").startswith("fp8"):
            fixes.append(
                Fix(
                    "--kv-cache-dtype fp8_e4m3" if not vllm else "--kv-cache-dtype fp8",
                    "An FP8 KV cache halves bytes per token, so the same budget holds about twice the tokens.",
                )
            )
        fixes.append(_more_gpus(m, "the KV budget grows by what the weights give back.", engine))
        return fixes
    if kind is ErrorKind.FREE_MEMORY:
        m_free = _FREE_ON_START.search(message)
        if m_free:
            free, total = float(m_free.group(1)), float(m_free.group(2))
            cap = _floor_to(free / total - 0.01, 0.01)
            fixes.append(
                Fix(
                    f"--gpu-memory-utilization {cap:.2f}" if vllm else f"--mem-fraction-static {cap:.2f}",
                    f"Only {free:.2f} of {total:.2f} GiB was free at startup; the share must fit in what is free "
                    f"({free / total:.2f} of the card), and the KV cache shrinks with it.",
                )
            )
        fixes.append(
            Fix(
                "free the GPU (nvidia-smi: another server or a previous run still holds memory)",
                "The engine measures free memory before loading anything; memory held by other processes is lost.",
            )
        )
        return fixes
    if kind is ErrorKind.KV_EXHAUSTED:
        fixes.append(
            Fix(
                "--max-running-requests <lower>",
                "The KV pool filled up while serving; fewer concurrent requests need fewer KV tokens at once.",
            )
        )
        fixes.append(Fix("--chunked-prefill-size <lower>", "Smaller prefill chunks claim KV tokens in smaller steps."))
        fixes.append(_raise_fraction(m, message, engine))
        return fixes
    # A CUDA allocation failed.
    if phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE:
        return _vllm_draft_capture_fixes(m) if vllm else _draft_capture_fixes(m, oom)
    if phase is Phase.CUDA_GRAPH_CAPTURE:
        if vllm:
            cur = m.fraction
            new = max(0.5, _floor_to((cur or 0.9) - 0.05, 0.01))
            fixes.append(
                Fix(
                    f"--gpu-memory-utilization {new:.2f}",
                    "vLLM sizes the KV cache from an estimate of graph memory; a lower cap leaves the capture "
                    f"more room{' (now ' + format(cur, '.2f') + ')' if cur else ''}.",
                )
            )
            fixes.append(
                Fix(
                    "--max-num-seqs <lower> (or fewer cudagraph_capture_sizes)",
                    "Fewer/smaller captured batch sizes need less graph memory.",
                )
            )
            fixes.append(Fix("--enforce-eager", "No CUDA graphs at all: always fits, but decoding is much slower."))
            return fixes
        fixes.append(_lower_fraction(m, oom))
        fixes.append(_lower_graph_bs(m))
        if m.spec_draft_tokens:  # target verify graphs are sized by batch x draft tokens too
            steps = m.spec_steps
            fixes.append(
                Fix(
                    f"--speculative-num-steps {max(1, steps - 1)}" if steps and steps > 1 else "fewer draft tokens",
                    "Draft and verify graphs are sized by batch × draft tokens; fewer draft steps/tokens shrink them "
                    "(the draft decode graph is not captured at all with one step).",
                )
            )
        fixes.append(
            Fix(
                "--cuda-graph-backend-decode=disabled" if m.new_flags else "--disable-cuda-graph",
                "Last resort: no decode graphs, so nothing to capture; decoding gets much slower.",
            )
        )
        return fixes
    if phase is Phase.WEIGHT_LOADING:
        fixes.append(_more_gpus(m, "the weights no longer have to fit in one GPU's free memory.", engine))
        if m.total is not None and m.pre is not None and m.total - m.pre > 2:
            fixes.append(
                Fix(
                    "free the GPU (nvidia-smi)",
                    f"Only {m.pre:.1f} of {m.total:.1f} GiB was free before loading: "
                    f"{m.total - m.pre:.1f} GiB is used by something else.",
                )
            )
        fixes.append(Fix("a quantized checkpoint (FP8 / INT4)", "Fewer bytes per weight."))
        return fixes
    if phase is Phase.KV_CACHE_ALLOC:
        fixes.append(_lower_fraction(m, oom) if not vllm else _raise_fraction(m, message, engine))
        fixes.append(_more_gpus(m, "more room for everything else.", engine))
        return fixes
    # Warmup / serving / unknown: activations ran out of headroom.
    head = f" (available_gpu_mem was {m.runtime_headroom:.2f} GiB after startup)" if m.runtime_headroom else ""
    if vllm:
        fixes.append(
            Fix(
                "--gpu-memory-utilization <lower>",
                "Activations at runtime live outside the KV cache; a lower cap leaves them room.",
            )
        )
    else:
        fixes.append(_lower_fraction(m, oom))
    fixes.append(
        Fix(
            "--chunked-prefill-size <lower>" if not vllm else "--max-num-batched-tokens <lower>",
            f"The activation peak scales with the tokens of the largest prefill step{head}.",
        )
    )
    fixes.append(Fix("--max-running-requests <lower>" if not vllm else "--max-num-seqs <lower>", "Smaller batches."))
    return fixes


def _draft_capture_fixes(m: MemoryFacts, oom: OomFigures | None) -> list[Fix]:
    """A draft-graph OOM: the draft's own graph sizes first, then the batch sizes both share, then memory.

    SGLang's EAGLE workers capture the draft decode graph (bs x topk tokens per step) only when
    ``speculative_num_steps > 1``, and the draft-extend graph with bs x (steps + 1) tokens, for the same
    batch sizes as the target's graphs; both live outside the static share, like the target's.
    """
    fixes: list[Fix] = []
    steps = m.spec_steps
    if steps is None or steps > 1:
        new = max(1, steps - 1) if steps else None
        fixes.append(
            Fix(
                f"--speculative-num-steps {new}" if new else "--speculative-num-steps <fewer>",
                "The draft decode graph runs one draft forward per step and the draft-extend graph holds "
                f"bs × (steps + 1) tokens{f' (steps = {steps} now)' if steps else ''}; fewer steps shrink both, and "
                "with one step the draft decode graph is not captured at all. The target's graphs are unchanged.",
            )
        )
    if m.spec_topk is not None and m.spec_topk > 1:
        fixes.append(
            Fix(
                "--speculative-eagle-topk 1",
                f"The draft decode graph holds bs × topk tokens (topk = {m.spec_topk} now); topk 1 makes it the "
                "smallest.",
            )
        )
    fixes.append(_lower_graph_bs(m))
    fixes.append(_lower_fraction(m, oom))
    fixes.append(
        Fix(
            "--cuda-graph-backend-decode=disabled" if m.new_flags else "--disable-cuda-graph",
            "Last resort: no graphs for target or draft; decoding gets much slower.",
        )
    )
    return fixes


def _vllm_draft_capture_fixes(m: MemoryFacts) -> list[Fix]:
    """vLLM captures the drafter inside the target's capture pass; SpeculativeConfig's own ``enforce_eager``
    runs the drafter without graphs while the target keeps its, and fewer speculative tokens shrink it."""
    cur = m.fraction
    new = max(0.5, _floor_to((cur or 0.9) - 0.05, 0.01))
    return [
        Fix(
            "--speculative-config '{..., \"enforce_eager\": true}'",
            "Runs the drafter eagerly (no draft CUDA graphs) while the target keeps its graphs.",
        ),
        Fix(
            "--speculative-config '{..., \"num_speculative_tokens\": <fewer>}'",
            "The drafter's graphs are sized by batch × speculative tokens; fewer tokens shrink them.",
        ),
        Fix(
            f"--gpu-memory-utilization {new:.2f}",
            "vLLM sizes the KV cache from an estimate of graph memory; a lower cap leaves the capture more room"
            f"{' (now ' + format(cur, '.2f') + ')' if cur else ''}.",
        ),
    ]


_CRASH_FIXES: dict[ErrorKind, tuple[tuple[str, str], ...]] = {
    ErrorKind.ARCH: (
        (
            "install a build with kernels for this GPU",
            "The kernel was not compiled for this architecture (e.g. sm_120 needs CUDA 12.8+ wheels); memory "
            "settings cannot fix it.",
        ),
        (
            "choose another backend (--attention-backend / --moe-runner-backend)",
            "Pick a backend whose kernels support this GPU.",
        ),
    ),
    ErrorKind.NCCL: (
        ("rerun with NCCL_DEBUG=INFO", "NCCL names the failing transport or device in its own log."),
        (
            "check shared memory and P2P (docker --shm-size / --ipc=host, NCCL_P2P_DISABLE=1 to test)",
            "'unhandled system error' during communicator init is usually /dev/shm, P2P or IB setup.",
        ),
    ),
    ErrorKind.NETWORK: (
        (
            "check the peer ranks and the network (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, --dist-init-addr)",
            "A connection between ranks dropped; look for the first rank that failed, and the interface used.",
        ),
    ),
    ErrorKind.IMPORT: (
        ("fix the Python environment", "A module or symbol is missing or was built against other versions."),
    ),
    ErrorKind.COMPILE: (
        (
            "disable torch compile / clear the compile caches",
            "The failure is in a compiler (dynamo / inductor / triton), not in memory.",
        ),
    ),
    ErrorKind.IMBALANCE: (
        (
            "free the other processes on the GPUs",
            "Ranks see different free memory; the engine sizes every rank from the smallest.",
        ),
        (
            "SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK=1 (0.5.4) / SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK=0 (0.5.23)",
            "Turns the check into a warning when the imbalance is expected.",
        ),
    ),
    ErrorKind.HOST_KILL: (
        (
            "dmesg -T | grep -i oom",
            "Exit code -9 is SIGKILL: host RAM (OOM killer) or SGLang's own teardown, not GPU memory.",
        ),
    ),
    ErrorKind.ARGS: (("fix the launch flags", "The engine rejected its command line before starting."),),
    ErrorKind.FILE: (("check the model path / Hugging Face access", "The weights or config could not be found."),),
    ErrorKind.CUDA: (
        ("rerun with CUDA_LAUNCH_BLOCKING=1", "Finds the kernel that failed; often a driver/build mismatch or a bug."),
    ),
    ErrorKind.HOST_MEMORY: (
        (
            "free host RAM / raise the memory limit (free -g, ulimit -v, the container's memory limit)",
            "The operating system refused the allocation (mmap of a weight shard, a new process); GPU memory "
            "settings do not change it.",
        ),
    ),
    ErrorKind.PORT: (
        (
            "pick a free --port, or stop what holds it (ss -ltnp | grep :PORT)",
            "Another server, or a previous run that has not exited, still listens on the port.",
        ),
    ),
    ErrorKind.GRAPH_CAPTURE: (
        (
            "run once with CUDA graphs off (--disable-cuda-graph / --enforce-eager) to confirm",
            "Something issued a call CUDA graph capture forbids (a sync, an allocation, a collective on another "
            "stream); memory settings cannot fix it. Update the driver / ROCm or the feature that does it.",
        ),
    ),
    ErrorKind.WATCHDOG: (
        (
            "find the hung rank (py-spy dump), raise --watchdog-timeout if it is slow, not stuck",
            "A step or collective did not finish in time.",
        ),
    ),
}


def fixes_for(
    engine: Engine | None,
    phase: Phase | None,
    kind: ErrorKind,
    facts: MemoryFacts,
    oom: OomFigures | None,
    message: str,
    memory: bool,
) -> tuple[Fix, ...]:
    """The ranked fixes for a failure of ``kind`` in ``phase`` (memory fixes only when ``memory``)."""
    if memory:
        return tuple(_memory_fixes(engine, phase, kind, facts, oom, message))
    return tuple(Fix(c, w) for c, w in _CRASH_FIXES.get(kind, ()))
