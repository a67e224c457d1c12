"""A fast per-line verdict for the live watcher: is this line ready, fatal, OOM, progress or noise?

The watcher tails a growing log and must keep up with a server printing tens of thousands of lines per
second, so this does no parsing and no state: one pass of substring checks, most specific first, on the
raw line (prefix, ANSI codes and all). A regex runs only to confirm the rare candidate lines (exception
lines). For figures and tracebacks use :class:`~dsv4lab.logs.parse.LogParser`; for a verdict on a
whole log, :func:`~dsv4lab.logs.runs.diagnose`.
"""

from __future__ import annotations

from enum import Enum

from dsv4lab.logs.events import Phase
from dsv4lab.logs.patterns import EXCEPTION_LINE

__all__ = ["LineKind", "classify_line"]


class LineKind(Enum):
    """What one log line tells a watcher. Progress kinds carry the startup :attr:`phase` they prove."""

    READY = "ready"
    OOM = "oom"
    FATAL = "fatal"
    WARNING = "warning"
    OTHER = "other"
    DIST_INIT = "dist_init"
    WEIGHTS = "weights"
    KV_CACHE = "kv_cache"
    CUDA_GRAPH = "cuda_graph"
    DRAFT_CUDA_GRAPH = "draft_cuda_graph"
    HTTP = "http"
    WARMUP = "warmup"
    SERVING = "serving"

    @property
    def phase(self) -> Phase | None:
        """The phase a progress line proves the server is in (None for non-progress kinds)."""
        return _PHASE.get(self)

    @property
    def is_progress(self) -> bool:
        return self in _PHASE


_PHASE: dict[LineKind, Phase] = {
    LineKind.DIST_INIT: Phase.STARTUP_OTHER,
    LineKind.WEIGHTS: Phase.WEIGHT_LOADING,
    LineKind.KV_CACHE: Phase.KV_CACHE_ALLOC,
    LineKind.CUDA_GRAPH: Phase.CUDA_GRAPH_CAPTURE,
    LineKind.DRAFT_CUDA_GRAPH: Phase.DRAFT_CUDA_GRAPH_CAPTURE,
    LineKind.HTTP: Phase.WARMUP,
    LineKind.WARMUP: Phase.WARMUP,
    LineKind.SERVING: Phase.SERVING,
}

_OOM = (
    "out of memory. Tried",
    "OutOfMemoryError",
    "CUDA out of memory",
    "HIP out of memory",
    "CUDA error: out of memory",
    "Not enough memory. Please try to increase",
    "Loaded weights leave no GPU memory",
    "No available memory for the cache blocks",
    "Prefill out of memory",
    "Decode out of memory",
)
_FATAL = (
    "Traceback (most recent call last)",
    "Capture cuda graph failed",
    "hit an exception",
    "Received sigquit",
    "SIGQUIT received",
    "include_parent=True",
    "scheduler is dead",
    "died during initialization",
    "Initialization failed",
    "NCCL error",
    "EngineCore failed to start",
    "Engine core initialization failed",
    "WorkerProc failed to start",
    "crashed with exit code",
    "watchdog timeout",
    "no kernel image is available",
    "error while attempting to bind",
    "Error while finding module specification",
    "EngineDeadError",
    "encountered a fatal error",
    "Fatal Python error",
    "less than desired GPU memory utilization",
    "To serve at least one request",
    "output_handler failed",
)
# Import/ABI and port failures say so mid-line, often before any engine line. A warning that only mentions
# them (vLLM's "Failed to import from vllm._C with ImportError(...)") is not fatal.
_EARLY_LATE = ("No module named", "undefined symbol", "address already in use", "Address already in use")
_NOT_FATAL = ("WARNING ", "WARN ", "] WARNING", ") WARNING", "Ignore import error", "Failed to import")
# (needle, kind) for progress; the first match wins, so more specific needles come first.
_PROGRESS = (
    ("Capturing batches", LineKind.CUDA_GRAPH),
    ("Capture draft", LineKind.DRAFT_CUDA_GRAPH),
    ("Capture cuda graph", LineKind.CUDA_GRAPH),
    ("Capture cpu graph", LineKind.CUDA_GRAPH),
    ("CUDA graph begin", LineKind.CUDA_GRAPH),
    ("CUDA graph end", LineKind.CUDA_GRAPH),
    ("Capturing CUDA graph", LineKind.CUDA_GRAPH),
    ("Capturing cudagraphs", LineKind.CUDA_GRAPH),
    ("Capturing prefill shape", LineKind.CUDA_GRAPH),
    ("Graph capturing finished", LineKind.CUDA_GRAPH),
    ("Load weight", LineKind.WEIGHTS),
    ("checkpoint shards", LineKind.WEIGHTS),
    ("Model loading took", LineKind.WEIGHTS),
    ("Loading model weights", LineKind.WEIGHTS),
    ("Starting to load model", LineKind.WEIGHTS),
    ("KV Cache is allocated", LineKind.KV_CACHE),
    ("KV Cache VA upper bound", LineKind.KV_CACHE),
    ("Memory pool end", LineKind.KV_CACHE),
    ("GPU KV cache size", LineKind.KV_CACHE),
    ("Available KV cache memory", LineKind.KV_CACHE),
    ("# GPU blocks", LineKind.KV_CACHE),
    ("max_total_num_tokens=", LineKind.KV_CACHE),
    ("Init torch distributed", LineKind.DIST_INIT),
    ("Init parallel", LineKind.DIST_INIT),
    ("Uvicorn running", LineKind.HTTP),
    ("Application startup complete", LineKind.HTTP),
    ("Started server process", LineKind.HTTP),
    ("Starting vLLM API server", LineKind.HTTP),
    ("init engine", LineKind.WARMUP),
    ("/get_model_info", LineKind.WARMUP),
    ("/model_info", LineKind.WARMUP),
)


def classify_line(line: str) -> LineKind:
    """The kind of one raw log line. Pure and cheap (~1 µs): safe to call on every line of a live log."""
    # The commonest lines of a serving log first.
    if "batch" in line and ("Decode batch" in line or "Prefill batch" in line):
        return LineKind.SERVING
    if "Avg generation throughput" in line:
        return LineKind.SERVING
    if "ready to roll" in line:
        return LineKind.READY
    if "HTTP/1" in line and "INFO:" in line:  # a uvicorn access-log line: a request was served
        return LineKind.OTHER
    if "emory" in line or "OutOfMemory" in line:
        for needle in _OOM:
            if needle in line:
                return LineKind.OOM
    for needle in _FATAL:
        if needle in line:
            return LineKind.FATAL
    if "No module" in line or "symbol" in line or "in use" in line:
        for needle in _EARLY_LATE:
            if needle in line:
                # A warning that mentions one (torch's "[W..." bind retry, SGLang's optional-model imports)
                # is not the death.
                survivable = "[W" in line[:24] or any(w in line for w in _NOT_FATAL)
                return LineKind.WARNING if survivable else LineKind.FATAL
    if "kill_process_tree" in line and "include_parent=True" in line:
        return LineKind.FATAL
    for needle, kind in _PROGRESS:
        if needle in line:
            return kind
    if "Error" in line or "Exception" in line:
        stripped = line.lstrip()
        if EXCEPTION_LINE.match(stripped):
            name = stripped.split(":", 1)[0]
            return LineKind.WARNING if name.endswith("Warning") else LineKind.FATAL
    if "WARN" in line or "Warning" in line or "warning" in line:
        return LineKind.WARNING
    return LineKind.OTHER
