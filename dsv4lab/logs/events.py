"""Typed events read from SGLang and vLLM logs.

Every parsed line that means something becomes one frozen event, so that notebooks, the memory model and
the diagnosis all work from the same facts instead of re-reading text. Events carry where they came from
(line number, timestamp, rank) because multi-GPU logs interleave ranks and "which GPU said this" is often
the whole answer. Memory figures are always GiB floats: SGLang's "GB" is GiB (bytes / 2**30), and PyTorch's
MiB/KiB/bytes are converted on the way in, so nothing downstream has to remember a unit.

A serving log is mostly batch-stats lines, so :class:`DecodeBatch` and :class:`PrefillBatch` keep the line
and parse their numbers on first access (:attr:`DecodeBatch.stats`, cached): the parser only has to
recognise them, which keeps a streaming parse above 300k lines/s. Everything else is parsed eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from dsv4lab.logs.batchstats import DecodeStats, Engine, PrefillStats, decode_stats, prefill_stats

__all__ = [
    "Capacity",
    "DecodeBatch",
    "DecodeStats",
    "DeviceMap",
    "DistInit",
    "Engine",
    "ErrorEvent",
    "ErrorKind",
    "Event",
    "GraphCapture",
    "GraphProgress",
    "KVCache",
    "KernelConfig",
    "LogWarning",
    "MemoryPoolEnd",
    "OomFigures",
    "Phase",
    "PhaseChange",
    "PrefillBatch",
    "PrefillStats",
    "RunEnd",
    "RunStart",
    "ServerArgs",
    "VllmMemoryProfile",
    "WeightLoad",
]


class Phase(str, Enum):
    """Where a server was in its life when a line was written (or when it failed).

    The startup steps come in the order the engines run them: distributed init and other setup
    (``startup_other``), weights, KV pool, CUDA graphs (target, then draft), HTTP server + warmup, serving.
    """

    STARTUP_OTHER = "startup_other"
    WEIGHT_LOADING = "weight_loading"
    KV_CACHE_ALLOC = "kv_cache_alloc"
    CUDA_GRAPH_CAPTURE = "cuda_graph_capture"
    DRAFT_CUDA_GRAPH_CAPTURE = "draft_cuda_graph_capture"
    WARMUP = "warmup"
    SERVING = "serving"


class ErrorKind(str, Enum):
    """What an error says its cause is; the diagnosis ranks these to find the root cause.

    Only the memory kinds (OOM, KV budget/exhausted, too little free memory at startup) mean outcome
    ``oom``: everything else is a crash even when memory was low at the time.
    """

    OOM = "oom"  # a CUDA/HIP allocation failed
    KV_BUDGET = "kv_budget"  # the KV pool budget came out <= 0 (raise the fraction)
    KV_EXHAUSTED = "kv_exhausted"  # the running KV pool could not fit a batch
    ARCH = "arch"  # no kernel for this GPU architecture
    NCCL = "nccl"
    NETWORK = "network"  # gloo / TCP store / sockets
    IMPORT = "import"
    COMPILE = "compile"  # torch.compile / inductor / triton compile failures
    IMBALANCE = "imbalance"  # free memory differs across TP ranks
    FREE_MEMORY = "free_memory"  # less GPU memory free at startup than the configured share asks for
    PORT = "port"  # the HTTP or a distributed port is already taken
    GRAPH_CAPTURE = "graph_capture"  # an operation CUDA graph capture does not allow (not memory)
    HOST_MEMORY = "host_memory"  # the host (RAM, mmap, ulimit) refused memory: not a GPU OOM
    HOST_KILL = "host_kill"  # SIGKILL (-9), often the OS OOM killer
    ARGS = "args"  # the launch command was rejected
    FILE = "file"  # weights/config not found or not downloadable
    CUDA = "cuda"  # other CUDA runtime errors (illegal address, device assert)
    WATCHDOG = "watchdog"  # a forward step or collective hung
    TEARDOWN = "teardown"  # the engine tearing itself down after a child failed
    OTHER = "other"  # an exception whose text matched no known cause
    UNKNOWN = "unknown"  # the message itself is missing (cut-off traceback)


@dataclass(frozen=True, kw_only=True)
class Event:
    """Base of every event: where the line was and who wrote it."""

    line_no: int
    text: str = ""
    ts: str | None = None
    rank: int | None = None  # TP rank (SGLang ``TPn``, vLLM ``Worker_TPn`` / ``rank=n`` / ``[rankn]``)
    dp: int | None = None
    engine: Engine | None = None


_E = TypeVar("_E", bound=Event)


@dataclass(frozen=True, kw_only=True)
class DistInit(Event):
    """Distributed init begin/end, or 0.5.23's memory baseline; ``usage_gib`` where the line gives one."""

    stage: str  # "begin" | "end" | "baseline"
    usage_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class WeightLoad(Event):
    """``Load weight begin/end`` (SGLang) or ``Model loading took`` (vLLM).

    ``avail_gib`` is free memory on the rank at that moment; ``usage_gib`` is what the weights took.
    """

    stage: str  # "begin" | "end"
    avail_gib: float | None = None
    usage_gib: float | None = None
    model_class: str | None = None
    dtype: str | None = None
    quant: str | None = None
    elapsed_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class KVCache(Event):
    """The KV pool: SGLang ``KV Cache is allocated`` / vLLM ``GPU KV cache size`` / ``# GPU blocks``."""

    tokens: int | None = None
    k_gib: float | None = None
    v_gib: float | None = None
    kv_gib: float | None = None
    dtype: str | None = None
    label: str | None = None  # "Full", "SWA", "Post-capture" ...
    upper_bound: bool = False  # 0.5.23 post-capture sizing reserves a VA upper bound first
    blocks: int | None = None  # vLLM

    @property
    def size_gib(self) -> float | None:
        """Total pool bytes on the rank in GiB (K + V, or the MLA / vLLM single figure)."""
        if self.kv_gib is not None:
            return self.kv_gib
        if self.k_gib is not None and self.v_gib is not None:
            return self.k_gib + self.v_gib
        return None


@dataclass(frozen=True, kw_only=True)
class MemoryPoolEnd(Event):
    """``Memory pool end. avail mem=`` : free memory once weights and KV are in place."""

    avail_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class GraphCapture(Event):
    """CUDA graph capture begin/end, old (``Capture cuda graph ...``) and new (``Capture {role} {graph} ...``).

    ``role`` is ``target`` or ``draft``; ``graph`` is ``decode``, ``verify``, ``prefill`` or ``extend``
    (old draft lines map to ``decode`` / ``extend``; the old target line to ``decode``).
    """

    stage: str  # "begin" | "end"
    role: str = "target"
    graph: str | None = None
    avail_gib: float | None = None
    usage_gib: float | None = None
    elapsed_s: float | None = None
    bs: tuple[int, ...] | None = None
    backend: str | None = None

    @property
    def is_draft(self) -> bool:
        return self.role == "draft"


@dataclass(frozen=True, kw_only=True)
class GraphProgress(Event):
    """One tqdm update of a capture bar (``Capturing batches (bs=.. avail_mem=.. GB): k/N``)."""

    done: int | None = None
    total: int | None = None
    bs: int | None = None
    avail_gib: float | None = None
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class Capacity(Event):
    """SGLang's scheduler summary, printed once everything is allocated (TP rank 0).

    ``available_gib`` (``available_gpu_mem``) is the headroom left for activations at runtime.
    """

    max_total_num_tokens: int | None = None
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int | None = None
    max_running_requests: int | None = None
    context_len: int | None = None
    available_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class VllmMemoryProfile(Event):
    """vLLM's memory-profiling summary (either the multi-figure line or ``Available KV cache memory``)."""

    total_gib: float | None = None
    utilization: float | None = None
    requested_gib: float | None = None
    weights_gib: float | None = None
    non_torch_gib: float | None = None
    activation_gib: float | None = None
    kv_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class PhaseChange(Event):
    """A line that proves the server reached a phase (uvicorn up, ready line, engine up)."""

    phase: Phase
    what: str
    ready: bool = False  # the definitive "ready to serve" line


def _fast_event(
    cls: type[_E], line_no: int, text: str, ts: str | None, rank: int | None, dp: int | None, engine: Engine | None
) -> _E:
    """Build a batch event without the frozen ``__init__`` (the parser's hot path; same fields, same result)."""
    obj = object.__new__(cls)
    d = obj.__dict__
    d["line_no"] = line_no
    d["text"] = text
    d["ts"] = ts
    d["rank"] = rank
    d["dp"] = dp
    d["engine"] = engine
    return obj


@dataclass(frozen=True, kw_only=True)
class DecodeBatch(Event):
    """SGLang ``Decode batch`` stats (vLLM's periodic throughput line maps here too).

    The numbers are parsed from :attr:`text` on first access to :attr:`stats` (or any of its properties).
    """

    @functools.cached_property
    def stats(self) -> DecodeStats:
        return decode_stats(self.text, self.engine)

    @property
    def running(self) -> int | None:
        return self.stats.running

    @property
    def tokens(self) -> int | None:
        return self.stats.tokens

    @property
    def token_usage(self) -> float | None:
        return self.stats.token_usage

    @property
    def accept_len(self) -> float | None:
        return self.stats.accept_len

    @property
    def accept_rate(self) -> float | None:
        return self.stats.accept_rate

    @property
    def cuda_graph(self) -> bool | None:
        return self.stats.cuda_graph

    @property
    def gen_throughput(self) -> float | None:
        return self.stats.gen_throughput

    @property
    def queue(self) -> int | None:
        return self.stats.queue

    @classmethod
    def fast(
        cls, line_no: int, text: str, ts: str | None, rank: int | None, dp: int | None, engine: Engine | None
    ) -> DecodeBatch:
        return _fast_event(cls, line_no, text, ts, rank, dp, engine)


@dataclass(frozen=True, kw_only=True)
class PrefillBatch(Event):
    """SGLang ``Prefill batch`` stats, parsed from :attr:`text` on first access to :attr:`stats`."""

    @functools.cached_property
    def stats(self) -> PrefillStats:
        return prefill_stats(self.text)

    @property
    def new_seq(self) -> int | None:
        return self.stats.new_seq

    @property
    def new_tokens(self) -> int | None:
        return self.stats.new_tokens

    @property
    def cached_tokens(self) -> int | None:
        return self.stats.cached_tokens

    @property
    def token_usage(self) -> float | None:
        return self.stats.token_usage

    @property
    def running(self) -> int | None:
        return self.stats.running

    @property
    def queue(self) -> int | None:
        return self.stats.queue

    @property
    def input_throughput(self) -> float | None:
        return self.stats.input_throughput

    @property
    def cuda_graph(self) -> bool | None:
        return self.stats.cuda_graph

    @classmethod
    def fast(
        cls, line_no: int, text: str, ts: str | None, rank: int | None, dp: int | None, engine: Engine | None
    ) -> PrefillBatch:
        return _fast_event(cls, line_no, text, ts, rank, dp, engine)


@dataclass(frozen=True, kw_only=True)
class KernelConfig(Event):
    """Which kernel config a GEMM picked: a tuned JSON (``tuned``) or the generic default."""

    kernel: str  # "w8a8_block_fp8" | "fused_moe"
    tuned: bool
    path: str | None = None


@dataclass(frozen=True, kw_only=True)
class LogWarning(Event):
    """A warning worth surfacing (vLLM WARNING level, Python warnings, SGLang advisory lines)."""

    message: str


@dataclass(frozen=True, slots=True)
class OomFigures:
    """The numbers in a PyTorch CUDA OOM message, in GiB. ``None`` where the message (or the log) is cut."""

    tried_gib: float | None = None
    gpu: int | None = None
    total_gib: float | None = None
    free_gib: float | None = None
    allocated_gib: float | None = None  # allocated by PyTorch
    private_pools_gib: float | None = None  # e.g. CUDA graphs
    reserved_gib: float | None = None  # reserved by PyTorch but unallocated


@dataclass(frozen=True, kw_only=True)
class ErrorEvent(Event):
    """A failure: one error line, or a whole traceback block with its exception lines.

    ``message`` is the most telling exception line (or the line itself); ``traceback`` keeps the block's
    lines (capped) for evidence; ``frames`` the ``file:function`` of each frame, innermost last, which is
    how the phase is told when the message is cut off. ``complete`` is False when the block ends before
    any exception line (a truncated log); ``cut`` when its exception line is the log's last line.
    """

    kind: ErrorKind
    message: str
    traceback: tuple[str, ...] = ()
    frames: tuple[str, ...] = ()
    oom: OomFigures | None = None
    complete: bool = True
    head: str | None = None  # e.g. "Scheduler hit an exception"
    cut: bool = False  # the exception line is the last line of the log, so its message may be cut short


@dataclass(frozen=True, kw_only=True)
class ServerArgs(Event):
    """The launch arguments the engine logged (``server_args=...`` / vLLM ``non-default args``)."""

    items: tuple[tuple[str, Any], ...] = ()

    @property
    def args(self) -> dict[str, Any]:
        return dict(self.items)

    def get(self, key: str, default: Any = None) -> Any:
        for k, v in self.items:
            if k == key:
                return v
        return default

    @staticmethod
    def from_mapping(mapping: Mapping[str, Any], **base: Any) -> ServerArgs:
        return ServerArgs(items=tuple(mapping.items()), **base)


@dataclass(frozen=True, kw_only=True)
class RunStart(Event):
    """A new server run begins in the same file (timestamps jump back, or a second ``server_args``).

    Logs get appended across restarts and pasted together; the diagnosis looks at the last run only.
    """

    reason: str


@dataclass(frozen=True, kw_only=True)
class RunEnd(Event):
    """The engine says it is exiting on purpose or after a failure was handled (``include_parent=False``)."""

    reason: str


@dataclass(frozen=True, kw_only=True)
class DeviceMap(Event):
    """A ``CUDA_VISIBLE_DEVICES`` (or HIP / ROCR) assignment the log shows: the physical GPUs the process sees,
    in order, so a device index in a message (``GPU 0``, ``cuda:0``) maps to ``visible[index]``."""

    visible: tuple[int, ...]
