"""vLLM, the second engine: its line prefix and the startup, memory and failure lines that matter.

vLLM logs with a level and a source location (``INFO 12-31 14:54:54 [gpu_model_runner.py:3341] ...``),
in V1 behind a process tag (``(EngineCore_DP0 pid=441)``, ``(Worker_TP2 pid=99)``), and tracebacks of
worker processes come one prefixed line at a time. The memory story differs from SGLang's: one
``gpu_memory_utilization`` cap covers everything, the KV cache gets what is left after a profiling run, and
a KV budget <= 0 is ``No available memory for the cache blocks`` (raise the cap, shorten the context).
"""

from __future__ import annotations

from typing import Any

from dsv4lab.logs import patterns as P
from dsv4lab.logs.causes import classify_error_text, oom_figures
from dsv4lab.logs.events import (
    DecodeBatch,
    Engine,
    ErrorEvent,
    ErrorKind,
    Event,
    GraphCapture,
    GraphProgress,
    KVCache,
    LogWarning,
    Phase,
    PhaseChange,
    VllmMemoryProfile,
    WeightLoad,
)

__all__ = ["VllmPrefix", "parse_vllm_message", "split_vllm_prefix"]

_V = Engine.VLLM


class VllmPrefix:
    """A vLLM line split into process tag, level, timestamp and message."""

    __slots__ = ("dp", "key", "level", "msg", "rank", "ts")

    def __init__(self, key: str, level: str | None, ts: str | None, rank: int | None, dp: int | None, msg: str) -> None:
        self.key = key
        self.level = level
        self.ts = ts
        self.rank = rank
        self.dp = dp
        self.msg = msg


def _proc_ranks(proc: str | None) -> tuple[int | None, int | None]:
    if not proc:
        return None, None
    tp = P.VLLM_PROC_TP.search(proc)
    dp = P.VLLM_PROC_DP.search(proc)
    return (int(tp.group(1)) if tp else None, int(dp.group(1)) if dp else None)


def split_vllm_prefix(line: str) -> VllmPrefix | None:
    """Parse a vLLM-formatted line; None when the line is not in vLLM's format.

    ``key`` names the writing process, so interleaved tracebacks of several workers stay apart.
    """
    c = line[:1]
    if c == "(" or c in "DIWEC[":
        if c == "[" and line.startswith("[rank"):
            m = P.RANK_PREFIX.match(line)
            if m:
                r = int(m.group("rank"))
                msg = m.group("msg")
                g = P.GLOG_LEVEL.match(msg) if msg[:1] == "[" else None
                level = _GLOG.get(g.group(1)) if g else None
                return VllmPrefix(f"rank{r}", level, None, r, None, msg)
        m = P.VLLM_PREFIX.match(line)
        if m:
            proc = m.group("proc")
            rank, dp = _proc_ranks(proc)
            msg = m.group("msg")
            if "across cluster]" in msg:  # Ray dedup: one line for N workers, printed late
                msg = P.RAY_REPEATED.sub("", msg)
            return VllmPrefix(proc or "vllm", m.group("level"), m.group("ts"), rank, dp, msg)
        if c == "(":
            m = P.VLLM_PROC_ONLY.match(line)
            if m:
                proc = m.group("proc")
                rank, dp = _proc_ranks(proc)
                return VllmPrefix(proc, None, None, rank, dp, m.group("msg"))
    return None


_GLOG = {"E": "ERROR", "F": "CRITICAL", "W": "WARNING", "I": "INFO"}

#: vLLM's own lines that say which startup step is running (reference: vllm.md §2), by message start.
#: torch.compile runs inside the profiling pass, so its lines belong to KV sizing.
_STEP_LINES: tuple[tuple[tuple[str, ...], Phase, str], ...] = (
    (
        (
            "vLLM API server version",
            "vLLM server version",
            "Initializing a V1 LLM engine",
            "Initializing a V0 LLM engine",
            "Initializing an LLM engine",
            "Waiting for init message",
            "rank ",
            "vLLM is using nccl",
        ),
        Phase.STARTUP_OTHER,
        "engine setup",
    ),
    (
        (
            "Dynamo bytecode transform",
            "Compiling a graph for",
            "Cache the graph",
            "Directly load the compiled graph",
            "Memory profiling takes",
            "Memory profiling results",
            "Profiling CUDA graph memory",
            "Estimated CUDA graph memory",
            "Starting profile run",
            "Maximum concurrency for",
        ),
        Phase.KV_CACHE_ALLOC,
        "memory profiling / KV sizing",
    ),
    (
        ("Compile and warming up model", "Warming up FlashInfer", "Warming up sampler"),
        Phase.WARMUP,
        "kernel warmup",
    ),
    (("Supported_tasks", "Supported tasks"), Phase.WARMUP, "API server setup"),
)


def _gib(value: str, unit: str) -> float:
    v = float(value)
    return v / 1024 if unit.upper().startswith("M") else v


def parse_vllm_message(pre: VllmPrefix, line_no: int, text: str) -> Event | None:
    """The event for one vLLM message, or None."""
    msg = pre.msg
    base: dict[str, Any] = {
        "line_no": line_no,
        "text": text,
        "ts": pre.ts,
        "rank": pre.rank,
        "dp": pre.dp,
        "engine": _V,
    }
    if "Avg generation throughput" in msg:
        return DecodeBatch.fast(line_no, text, pre.ts, pre.rank, pre.dp, _V)
    if "took" in msg:
        m = P.VLLM_WEIGHTS.search(msg)
        if m:
            return WeightLoad(
                **base,
                stage="end",
                usage_gib=_gib(m.group(1), m.group(2)),
                elapsed_s=float(m.group(3)) if m.group(3) else None,
            )
        m = P.VLLM_GRAPH_DONE.search(msg)
        if m:
            return GraphCapture(
                **base,
                stage="end",
                elapsed_s=float(m.group(1)),
                usage_gib=_gib(m.group(2), m.group(3)) if m.group(2) else None,
            )
    if "KV cache" in msg or "blocks:" in msg or "KV Cache" in msg:
        m = P.VLLM_KV_TOKENS.search(msg)
        if m:
            return KVCache(**base, tokens=int(m.group(1).replace(",", "")))
        m = P.VLLM_KV_MEM.search(msg)
        if m:
            return VllmMemoryProfile(**base, kv_gib=_gib(m.group(1), m.group(2)))
        m = P.VLLM_BLOCKS.search(msg)
        if m:
            return KVCache(**base, blocks=int(m.group(1)))
        m = P.VLLM_PROFILE_SPLIT.search(msg)
        if m:
            return VllmMemoryProfile(
                **base,
                weights_gib=float(m.group(1)),
                non_torch_gib=float(m.group(2)),
                activation_gib=float(m.group(3)),
                kv_gib=float(m.group(4)),
            )
    if "gpu_memory_utilization (" in msg:
        m = P.VLLM_PROFILE_TOTAL.search(msg)
        if m:
            return VllmMemoryProfile(
                **base, total_gib=float(m.group(1)), utilization=float(m.group(2)), requested_gib=float(m.group(3))
            )
    if msg.startswith(("Capturing CUDA graph", "Capturing cudagraphs", "Capturing the model for CUDA graphs")):
        return GraphCapture(**base, stage="begin")
    if msg.startswith("Registering") and "cuda graph addresses" in msg:
        # Custom all-reduce registers the captured graphs' buffers once capture is over.
        return GraphProgress(**base, label="registering cuda graph addresses")
    if msg.startswith(("Starting to load model", "Loading weights took", "Loading model")):
        return WeightLoad(**base, stage="begin")
    if (
        "Starting vLLM API server" in msg
        or "Starting vLLM server on" in msg
        or "Uvicorn running on" in msg
        or "Application startup complete" in msg
        # serve_http logs the route list once the engine client is up, right before uvicorn serves: the
        # same moment as the server-start line, whose wording varies by release (and by redaction tools).
        or msg.startswith("Available routes are")
    ):
        return PhaseChange(**base, phase=Phase.SERVING, what="api server up", ready=True)
    if msg.startswith("init engine") and "took" in msg:
        return PhaseChange(**base, phase=Phase.WARMUP, what="engine initialised")
    if pre.level not in ("ERROR", "CRITICAL", "WARNING", "WARN"):
        if "[Autotuner]" in msg:  # FlashInfer's autotune, run by kernel warmup
            return PhaseChange(**base, phase=Phase.WARMUP, what="kernel warmup")
        for needles, phase, what in _STEP_LINES:
            if msg.startswith(needles) or (phase is Phase.KV_CACHE_ALLOC and "torch.compile" in msg):
                return PhaseChange(**base, phase=phase, what=what)
    level = pre.level
    if level in ("ERROR", "CRITICAL") or "Error" in msg or "out of memory" in msg or "No available memory" in msg:
        if "Traceback (most recent call last)" in msg:
            return None  # the parser assembles the block
        kind = classify_error_text(msg)
        if kind is ErrorKind.OTHER and level not in ("ERROR", "CRITICAL"):
            return None
        if kind is ErrorKind.OTHER and not P.EXCEPTION_LINE.match(msg):
            # An ERROR record that names no cause and is no exception line: a traceback fragment (code, carets)
            # or a request-level error the server lives through.
            return None
        return ErrorEvent(
            **base,
            kind=kind,
            message=msg,
            traceback=(text,),
            oom=oom_figures(msg) if kind is ErrorKind.OOM else None,
        )
    if level in ("WARNING", "WARN"):
        return LogWarning(**base, message=msg)
    if "Free memory on device" in msg:
        return ErrorEvent(**base, kind=ErrorKind.KV_BUDGET, message=msg, traceback=(text,))
    return None
