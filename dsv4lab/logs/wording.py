"""The sentences of a diagnosis: the cause in one line and the evidence lines behind it.

A user reads ``cause`` first and often only that, so it states what failed, where, with the numbers the
log gave, and — when the decisive line is missing — says so, instead of presenting a guess as a finding.
"""

from __future__ import annotations

from dsv4lab.logs.events import Engine, ErrorEvent, ErrorKind, OomFigures, Phase
from dsv4lab.logs.fixes import MemoryFacts
from dsv4lab.logs.patterns import VLLM_KV_SPACE, VLLM_MAX_SEQ_LEN
from dsv4lab.logs.state import RunState

__all__ = ["PHASE_WORDS", "cause_sentence", "evidence_lines", "where"]

_MAX_EVIDENCE = 60
_MAX_EVIDENCE_CHARS = 600

#: Each startup phase as a sentence names it ("died in CUDA graph capture").
PHASE_WORDS = {
    Phase.STARTUP_OTHER: "startup (distributed init / setup)",
    Phase.WEIGHT_LOADING: "weight loading",
    Phase.KV_CACHE_ALLOC: "KV-cache sizing and allocation",
    Phase.CUDA_GRAPH_CAPTURE: "CUDA graph capture",
    Phase.DRAFT_CUDA_GRAPH_CAPTURE: "draft-model CUDA graph capture",
    Phase.WARMUP: "warmup",
    Phase.SERVING: "serving",
}

_CRASH_TEXTS = {
    ErrorKind.ARCH: "A kernel is missing for this GPU's architecture",
    ErrorKind.NCCL: "NCCL failed",
    ErrorKind.NETWORK: "A connection between ranks (gloo/TCP) failed",
    ErrorKind.IMPORT: "A Python import failed (a missing module or a library built against other versions)",
    ErrorKind.COMPILE: "A compile step (torch.compile / triton / inductor) failed",
    ErrorKind.IMBALANCE: "Free GPU memory differs across tensor-parallel ranks (another process uses some GPUs)",
    ErrorKind.HOST_KILL: "A process was killed with SIGKILL (the host OOM killer is a common cause, not GPU memory)",
    ErrorKind.ARGS: "The launch flags were rejected",
    ErrorKind.FILE: "A model file or repository could not be found or fetched",
    ErrorKind.CUDA: "A CUDA runtime error stopped the server",
    ErrorKind.WATCHDOG: "A step or collective hung until a watchdog fired",
    ErrorKind.PORT: "A port the server needs is already in use (another server or a previous run still holds it)",
    ErrorKind.GRAPH_CAPTURE: "An operation that CUDA graph capture does not allow ran while a graph was being captured",
    ErrorKind.HOST_MEMORY: "The host refused a memory allocation (RAM, mmap or ulimit), not the GPU",
}
_NOT_MEMORY = (ErrorKind.ARCH, ErrorKind.NCCL, ErrorKind.NETWORK, ErrorKind.PORT, ErrorKind.GRAPH_CAPTURE)
_NOT_GPU = (ErrorKind.HOST_MEMORY,)


def where(phase: Phase | None) -> str:
    """The phase in words, or an honest "a step the log does not show" when the log does not say."""
    return PHASE_WORDS[phase] if phase is not None else "a step the log does not show"


def _clip(text: str) -> str:
    """The message shortened for one sentence, without a final period (the sentence adds its own)."""
    text = text if len(text) <= 180 else text[:177] + "..."
    return text[:-1] if text.endswith(".") and not text.endswith("...") else text


def _size(gib: float) -> str:
    """GiB to two decimals, or MiB below 0.1 GiB (a 3 MiB allocation is not "0.00 GiB")."""
    return f"{gib:.2f} GiB" if gib >= 0.1 or gib == 0 else f"{gib * 1024:.1f} MiB"


def _oom(phase: Phase | None, oom: OomFigures | None, physical: int | None) -> str:
    local = oom.gpu if oom else None
    if physical is not None and local is not None and physical != local:
        gpu = f"GPU {physical} (the process's GPU {local}, under the log's CUDA_VISIBLE_DEVICES)"
    elif physical is not None or local is not None:
        gpu = f"GPU {physical if physical is not None else local}"
    else:
        gpu = "A GPU"
    figures = ""
    if oom and oom.tried_gib is not None:
        figures = f": a {_size(oom.tried_gib)} allocation failed"
        if oom.free_gib is not None:
            figures += f" with {_size(oom.free_gib)} free"
        if oom.total_gib is not None:
            figures += f" of {_size(oom.total_gib)}"
    reason = (
        {
            Phase.CUDA_GRAPH_CAPTURE: "; graph memory comes from the share outside the static memory fraction",
            Phase.DRAFT_CUDA_GRAPH_CAPTURE: "; draft graphs come from the share outside the static memory fraction",
            Phase.WEIGHT_LOADING: "; the weights do not fit in the free memory of one GPU",
            Phase.WARMUP: "; activations did not fit in the memory left after startup",
            Phase.SERVING: "; activations did not fit in the memory left after startup",
        }.get(phase, "")
        if phase is not None
        else ""
    )
    return f"{gpu} ran out of memory during {where(phase)}{figures}{reason}."


def cause_sentence(
    err: ErrorEvent,
    kind: ErrorKind,
    phase: Phase | None,
    oom: OomFigures | None,
    facts: MemoryFacts,
    gpu: int | None = None,
) -> str:
    """One sentence for a failure whose error line is in the log (``kind`` as read from it); ``gpu`` is the
    physical GPU when the log gives it."""
    msg = _clip(err.message.strip())
    if kind is ErrorKind.OOM:
        return _oom(phase, oom, gpu)
    if kind is ErrorKind.KV_BUDGET:
        space = VLLM_KV_SPACE.search(err.message)
        if space:
            free, total, asked = (float(space.group(i)) for i in (1, 2, 3))
            return (
                f"The KV cache asked for {asked:.2f} GiB, more than the {free:.2f} of {total:.2f} GiB available on "
                f"the CPU's memory node (vLLM's CPU backend keeps the KV cache in host RAM) ({msg})."
            )
        if facts.post is not None and facts.weights is not None:
            return (
                f"No memory was left for the KV cache: the weights took {facts.weights:.2f} GiB per GPU and left "
                f"{facts.post:.2f} GiB, so the KV budget inside the static fraction came out <= 0 ({msg})."
            )
        seq = VLLM_MAX_SEQ_LEN.search(err.message)
        if seq:
            est = f"; vLLM estimates {int(seq['est']):,} tokens would fit" if seq["est"] else ""
            return (
                f"The KV cache ({float(seq['have']):.2f} GiB) cannot hold one request of max_model_len "
                f"{int(seq['len']):,} tokens, which needs {float(seq['need']):.2f} GiB{est} ({msg})."
            )
        cap = "gpu_memory_utilization" if err.engine is Engine.VLLM else "the static memory fraction"
        return f"Too little memory was left for the KV cache under {cap} ({msg})."
    if kind is ErrorKind.FREE_MEMORY:
        return (
            "Less GPU memory was free at startup than the configured share asks for (other processes hold the "
            f"rest), so the engine refused to start before loading weights ({msg})."
        )
    if kind is ErrorKind.KV_EXHAUSTED:
        return f"The KV pool could not hold the running batch while serving ({msg})."
    if kind in _CRASH_TEXTS:
        tail = " — not a memory problem" if kind in _NOT_MEMORY else (" — not GPU memory" if kind in _NOT_GPU else "")
        return f"{_CRASH_TEXTS[kind]} during {where(phase)}{tail}: {msg}."
    return f"The server failed during {where(phase)}: {msg}."


def evidence_lines(run: RunState, root: ErrorEvent, live: list[ErrorEvent]) -> tuple[str, ...]:
    """The failing rank's last progress line, the root error's block and a few other live errors, in order."""
    lines: list[tuple[int, str]] = []
    st = run.ranks.get(root.rank)
    ctx = st.last_progress if st is not None and st.last_progress is not None else run.last_progress
    if ctx is not None and ctx.line_no < root.line_no and ctx.text:
        lines.append((ctx.line_no, ctx.text))
    for i, text in enumerate(root.traceback):
        lines.append((root.line_no + i, text))
    extra = [e for e in live if e is not root][:6]
    for e in extra:
        if e.text:
            lines.append((e.line_no, e.text))
    lines.sort(key=lambda t: t[0])
    out = [t if len(t) <= _MAX_EVIDENCE_CHARS else t[:_MAX_EVIDENCE_CHARS] + "..." for _, t in lines]
    return tuple(out[:_MAX_EVIDENCE])
