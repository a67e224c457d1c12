"""What an error line says its cause is, and which startup step a traceback frame belongs to.

The rules are ordered by how *primary* a cause is. A rank that runs out of memory makes its peers fail
with NCCL or gloo errors, and the engine then tears everything down with its own messages; the first is
the root cause, the others are symptoms. So memory and environment causes (missing kernel for the GPU
architecture, import errors, compile errors, bad flags) rank above communication errors, which rank above
the teardown chain. Memory is only blamed for messages that *say* memory: SGLang's "Capture cuda graph
failed" wrapper prints memory hints after any error, so the hints never count, only the wrapped message.
"""

from __future__ import annotations

from dsv4lab.logs.events import ErrorKind, OomFigures
from dsv4lab.logs.patterns import (
    OOM,
    OOM_ALLOCATED,
    OOM_PRIVATE,
    OOM_RESERVED,
    to_gib,
)
from dsv4lab.logs.steps import frame_phase

__all__ = [
    "MEMORY_KINDS",
    "MODEL_INIT_FRAMES",
    "classify_error_text",
    "frame_phase",
    "is_fatal_text",
    "oom_figures",
    "tier",
]

#: Kinds that mean "memory was the cause" (outcome ``oom``).
MEMORY_KINDS = frozenset({ErrorKind.OOM, ErrorKind.KV_BUDGET, ErrorKind.KV_EXHAUSTED, ErrorKind.FREE_MEMORY})

# (kind, substrings) in priority order; the first kind with any substring in the text wins.
_RULES: tuple[tuple[ErrorKind, tuple[str, ...]], ...] = (
    (
        ErrorKind.KV_BUDGET,
        (
            "Not enough memory. Please try to increase --mem-fraction-static",
            "Loaded weights leave no GPU memory for the KV cache",
            "No available memory for the cache blocks",
            "larger than the maximum number of tokens that can be stored in KV cache",
            "To serve at least one request with the model",
            "max_running_request is zero",
            # vLLM's CPU worker, determine_available_memory: the KV budget asked for exceeds what the NUMA
            # node (the CPU backend's device memory) has available.
            "on kv cache allocation is less than requested memory for kv",
        ),
    ),
    # vLLM's startup check of free device memory against the utilization share (GPU worker, and the CPU
    # worker, where --gpu-memory-utilization is the share of the node's RAM).
    (ErrorKind.FREE_MEMORY, ("less than desired GPU memory utilization", "less than desired CPU memory utilization")),
    (ErrorKind.KV_EXHAUSTED, ("Prefill out of memory", "Decode out of memory", "alloc_req_slots runs out of memory")),
    (
        ErrorKind.ARCH,
        (
            "no kernel image is available",
            "cudaErrorNoKernelImageForDevice",
            "not supported on this architecture",
            "not supported for this architecture",
            "arch not supported",
            "Unsupported GPU architecture",
            "unsupported architecture",
            "is not compatible with the current PyTorch installation",
            "invalid device function",
            "sm_120 is not",
            "sm_100 is not",
            "Unsupported CUDA arch",
        ),
    ),
    (
        ErrorKind.OOM,
        (
            "out of memory",
            "OutOfMemoryError",
            "not enough GPU memory",
            "CUBLAS_STATUS_ALLOC_FAILED",
            "cudaErrorMemoryAllocation",
            "CUDA_ERROR_OUT_OF_MEMORY",
        ),
    ),
    (
        ErrorKind.GRAPH_CAPTURE,
        (
            "operation not permitted when stream is capturing",
            "StreamCaptureUnsupported",
            "StreamCaptureInvalidated",
            "capturing stream has unjoined work",
            "operation failed due to a previous error during capture",
        ),
    ),
    (
        ErrorKind.IMPORT,
        (
            "ImportError",
            "ModuleNotFoundError",
            "undefined symbol",
            "cannot import name",
            "No module named",
            "Error while finding module specification",
            "Could not load any common_ops",
            "cannot open shared object file",
        ),
    ),
    (ErrorKind.HOST_MEMORY, ("Cannot allocate memory", "unable to mmap", "[Errno 12]")),
    (
        ErrorKind.PORT,
        ("Address already in use", "address already in use", "EADDRINUSE", "error while attempting to bind"),
    ),
    (
        ErrorKind.COMPILE,
        (
            "torch._dynamo",
            "torch._inductor",
            "BackendCompilerFailed",
            "InductorError",
            "CompilationError",
            "ptxas",
            "nvcc fatal",
            "torch.compile",
            "Triton Error",
            "compile failed",
        ),
    ),
    (ErrorKind.IMBALANCE, ("memory capacity is unbalanced",)),
    (
        ErrorKind.NCCL,
        (
            "NCCL error",
            "ncclCommInitRank",
            "ncclUnhandledCudaError",
            "ncclSystemError",
            "ncclInternalError",
            "ncclRemoteError",
            "ProcessGroupNCCL",
            "NCCL communicator",
            "NCCL timeout",
        ),
    ),
    (
        ErrorKind.NETWORK,
        (
            "gloo",
            "Connection closed",
            "Connection reset",
            "Connection refused",
            "DistNetworkError",
            "TCPStore",
            "Broken pipe",
            "Socket Timeout",
            "Name or service not known",
        ),
    ),
    (ErrorKind.HOST_KILL, ("exit code: -9", "exit code -9", "exitcode: -9", "OOM killer", "SIGKILL", "': -9}")),
    (
        ErrorKind.ARGS,
        ("ambiguous option", "unrecognized arguments", "error: argument", "invalid choice", "the following arguments"),
    ),
    (
        ErrorKind.FILE,
        (
            "FileNotFoundError",
            "No such file or directory",
            "does not appear to have a file named",
            "Repository Not Found",
            "HFValidationError",
            "401 Client Error",
            "GatedRepoError",
            "not a valid model identifier",
        ),
    ),
    (
        ErrorKind.CUDA,
        (
            "CUDA error",
            "illegal memory access",
            "device-side assert",
            "HIP error",
            "Memory access fault",
            "cudaError",
            "CUBLAS_STATUS",
            "AcceleratorError",
        ),
    ),
    (ErrorKind.WATCHDOG, ("watchdog timeout", "Watchdog caught collective operation timeout")),
    (
        ErrorKind.TEARDOWN,
        (
            "Received sigquit",
            "SIGQUIT received",
            "kill_process_tree",
            "scheduler is dead",
            "died during initialization",
            "Initialization failed",
            "EngineCore failed to start",
            "Engine core initialization failed",
            "WorkerProc failed to start",
            "hit an exception",
            "crashed with exit code",
            "Exit code:",
            "Engine process failed to start",
            "output_handler failed",
            "EngineDeadError",
            "encountered a fatal error",
            "died unexpectedly",
            "RayTaskError",
            "See root cause above",
            "Dumping input data",
            "please check the stack trace above",
            "while processing method",
            "This might cause deadlock",
        ),
    ),
)

_TIER: dict[ErrorKind, int] = {
    ErrorKind.KV_BUDGET: 0,
    ErrorKind.KV_EXHAUSTED: 0,
    ErrorKind.OOM: 0,
    ErrorKind.ARCH: 0,
    ErrorKind.IMPORT: 0,
    ErrorKind.COMPILE: 0,
    ErrorKind.IMBALANCE: 0,
    ErrorKind.FREE_MEMORY: 0,
    ErrorKind.PORT: 0,
    ErrorKind.GRAPH_CAPTURE: 0,
    ErrorKind.HOST_MEMORY: 0,
    ErrorKind.ARGS: 0,
    ErrorKind.FILE: 0,
    ErrorKind.CUDA: 1,
    ErrorKind.NCCL: 2,
    ErrorKind.NETWORK: 2,
    ErrorKind.WATCHDOG: 2,
    ErrorKind.HOST_KILL: 2,
    ErrorKind.OTHER: 3,
    ErrorKind.UNKNOWN: 4,
    ErrorKind.TEARDOWN: 5,
}


def tier(kind: ErrorKind) -> int:
    """Lower = more likely the root cause (see the module docstring)."""
    return _TIER[kind]


def classify_error_text(text: str) -> ErrorKind:
    """The cause a single error text states; ``OTHER`` when it states none we know."""
    for kind, needles in _RULES:
        for needle in needles:
            if needle in text:
                if kind is ErrorKind.OOM and needle == "out of memory" and not _real_oom(text):
                    continue
                return kind
    return ErrorKind.OTHER


def _real_oom(text: str) -> bool:
    # "out of memory" also occurs in advice ("If out of memory occurs, ...") and in the OS OOM-killer hint.
    # Advice ("If you are running out of memory, consider ...") names memory without reporting a failure.
    low = text.lower()
    return any(
        p in low
        for p in ("cuda out of memory", "hip out of memory", "error: out of memory", "cuda error: out of memory")
    ) or ("out of memory" in low and ("tried to allocate" in low or "runtimeerror" in low or "exception" in low))


def is_fatal_text(text: str) -> bool:
    """True when a standalone line (outside a traceback) reports a failure on its own."""
    kind = classify_error_text(text)
    return kind not in (ErrorKind.OTHER, ErrorKind.UNKNOWN)


def oom_figures(text: str) -> OomFigures | None:
    """Numbers of a PyTorch OOM message (new and pre-2.0 formats); None if the text has no OOM message."""
    m = OOM.search(text)
    if not m:
        return None
    if m.group("gpu_old"):
        return OomFigures(
            tried_gib=to_gib(m.group("tried")),
            gpu=int(m.group("gpu_old")),
            total_gib=to_gib(m.group("total_old")),
            free_gib=to_gib(m.group("free_old")),
            allocated_gib=to_gib(m.group("alloc_old")),
        )
    gpu = m.group("gpu")
    tail = text[m.end() :]
    allocated = OOM_ALLOCATED.search(tail)
    private = OOM_PRIVATE.search(tail)
    reserved = OOM_RESERVED.search(tail)
    return OomFigures(
        tried_gib=to_gib(m.group("tried"), default_unit="MiB") if m.group("tried") else None,
        gpu=int(gpu) if gpu is not None else None,
        total_gib=to_gib(m.group("total")),
        free_gib=to_gib(m.group("free")),
        allocated_gib=to_gib(allocated.group("v")) if allocated else None,
        private_pools_gib=to_gib(private.group("v")) if private else None,
        reserved_gib=to_gib(reserved.group("v")) if reserved else None,
    )


#: Frames that only say "inside model-runner / worker construction" without naming the step.
MODEL_INIT_FRAMES = ("model_runner.py:__init__", "model_runner.py:initialize", "tp_worker.py:__init__")
