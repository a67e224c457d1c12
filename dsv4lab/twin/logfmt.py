"""SGLang's log lines, per release, written the way SGLang's logging writes them.

Every line is ``[YYYY-mm-dd HH:MM:SS{rank prefix}] message`` (no level, no milliseconds unless
``SGLANG_LOG_MS=1``); scheduler ranks add `` TP{n}`` (only when tp > 1), `` DP{n}`` and `` EP{n}``.
Each record goes out in one ``os.write`` so that lines from several processes sharing the log file
(opened with O_APPEND by the launch script) never interleave mid-line. The message shapes follow the
reference (``reference/sglang.md`` §1-§4); the twin's tests parse them with its §10 expressions.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

from tqdm import tqdm

from dsv4lab.config.versions import SGLangRelease
from dsv4lab.twin.clock import TwinClock

__all__ = ["GiB", "LogWriter", "Progress", "Rank", "fmt_gb", "format_size", "rank_prefix"]

#: Bytes in a GiB: SGLang's log figures are GiB ("GB" in its text).
GiB = 1024**3


@dataclass(frozen=True)
class Rank:
    """One scheduler process: which GPU it drives and its place in the parallel layout."""

    gpu: int
    tp_rank: int
    tp_size: int
    dp_rank: int = 0
    dp_size: int = 1
    ep_size: int = 1


def rank_prefix(release: SGLangRelease, rank: Rank | None) -> str:
    """`` DP0 TP3`` and friends; empty for the main process and for tp=1 without dp/ep."""
    if rank is None:
        return ""
    parts: list[str] = []
    if rank.dp_size > 1:
        parts.append(f"DP{rank.dp_rank}")
    if rank.tp_size > 1:
        parts.append(f"TP{rank.tp_rank}")
    if rank.ep_size > 1:
        parts.append(f"EP{rank.tp_rank % rank.ep_size}")
    return "".join(" " + p for p in parts)


def fmt_gb(x: float) -> str:
    """SGLang's ``{x:.2f}`` of GiB values (its "GB" is GiB)."""
    return f"{x:.2f}"


def format_size(n_bytes: float) -> str:
    """PyTorch's ``format_size`` for OOM messages: bytes, KiB, MiB or GiB."""
    if n_bytes <= 1048576 and n_bytes < 1024:
        return f"{int(n_bytes)} bytes"
    if n_bytes < 1048576:
        return f"{n_bytes / 1024:.2f} KiB"
    if n_bytes < GiB:
        return f"{n_bytes / 1048576:.2f} MiB"
    return f"{n_bytes / GiB:.2f} GiB"


class LogWriter:
    """Writes prefixed, timestamped records to a file descriptor, one ``write`` per record."""

    def __init__(
        self, release: SGLangRelease, rank: Rank | None = None, fd: int = 1, clock: TwinClock | None = None
    ) -> None:
        self.release = release
        self.prefix = rank_prefix(release, rank)
        self.fd = fd
        self.ms = os.environ.get("SGLANG_LOG_MS", "") == "1"
        #: Whose time the stamps tell: the twin's modelled clock (None: the wall clock).
        self.clock = clock

    def stamp(self) -> str:
        now = self.clock.stamp() if self.clock is not None else time.time()
        text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
        if self.ms:
            text += f".{int(now * 1000) % 1000:03d}"
        return text

    def log(self, message: str) -> None:
        self.raw(f"[{self.stamp()}{self.prefix}] {message}\n")

    def uvicorn(self, message: str, level: str = "INFO") -> None:
        """Uvicorn's ``%(levelprefix)s``: the level name and a colon, padded to 9 characters."""
        self.raw(f"[{self.stamp()}] {(level + ':').ljust(9)} {message}\n")

    def raw(self, text: str) -> None:
        data = text.encode("utf-8", "replace")
        while data:
            try:
                n = os.write(self.fd, data)
            except InterruptedError:
                continue
            except OSError:
                return  # the log went away (closed pipe); nothing useful left to do
            data = data[n:]


class Progress:
    """A tqdm-style bar on stderr (carriage-return updates), like SGLang's capture and shard bars."""

    def __init__(self, desc: str, total: int, fd: int = 2) -> None:
        self.desc = desc
        self.total = total
        self.n = 0
        self.fd = fd
        self.start = time.monotonic()
        self._write()

    def _write(self, end: str = "\r") -> None:
        line = tqdm.format_meter(self.n, self.total, time.monotonic() - self.start, prefix=self.desc, ncols=None)
        # The carriage return goes *after* the bar, so that a line another process writes next
        # starts a fresh segment of the file (a terminal still shows the bar updating in place).
        with contextlib.suppress(OSError):
            os.write(self.fd, (line + end).encode())

    def update(self, desc: str | None = None) -> None:
        self.n += 1
        if desc is not None:
            self.desc = desc
        self._write()

    def set_desc(self, desc: str) -> None:
        self.desc = desc
        self._write()

    def close(self) -> None:
        self._write("\n")


# -- message shapes ---------------------------------------------------------------------------------------------


def is_new(release: SGLangRelease) -> bool:
    return release.log_style == "new"


def init_begin(release: SGLangRelease) -> str:
    return "Init parallel begin." if release.key >= (0, 5, 23) else "Init torch distributed begin."


def init_end(release: SGLangRelease, elapsed: float, mem_usage: float) -> list[str]:
    if release.key >= (0, 5, 23):
        return [
            f"Init parallel ends. elapsed={elapsed:.2f} s",
            f"Memory baseline taken. mem usage={fmt_gb(mem_usage)} GB",
        ]
    return [f"Init torch distributed ends. mem usage={fmt_gb(mem_usage)} GB"]


def load_weight_end(
    release: SGLangRelease, elapsed: float, model_class: str, quant: str, avail: float, usage: float
) -> str:
    if is_new(release):
        return (
            f"Load weight end. elapsed={elapsed:.2f} s, type={model_class}, quant={quant}, "
            f"avail mem={fmt_gb(avail)} GB, mem usage={fmt_gb(usage)} GB."
        )
    return (
        f"Load weight end. type={model_class}, dtype=torch.bfloat16, avail mem={fmt_gb(avail)} GB, "
        f"mem usage={fmt_gb(usage)} GB."
    )


def kv_allocated(release: SGLangRelease, dtype: str, tokens: int, size_gib: float) -> str:
    if is_new(release):
        return f"KV Cache is allocated. dtype: {dtype}, #tokens: {tokens}, KV size: {fmt_gb(size_gib)} GB"
    return f"KV Cache is allocated. #tokens: {tokens}, KV size: {fmt_gb(size_gib)} GB"


def capture_begin(
    release: SGLangRelease, role: str, runner: str, tokens_per_req: int, bs: Sequence[int], avail: float
) -> str:
    """Begin line of one graph runner (runner: decode, verify, extend, draft_decode)."""
    bs_text = "[" + ", ".join(str(b) for b in bs) + "]"
    if is_new(release):
        kind = "decode" if runner == "draft_decode" else runner
        bs_part = f"bs={bs_text}, " if (release.key < (0, 5, 23) or role == "draft") else ""
        return (
            f"Capture {role} {kind} CUDA graph begin. backend=full, num_tokens_per_req={tokens_per_req}, "
            f"{bs_part}avail mem={fmt_gb(avail)} GB"
        )
    label = {"decode": "cuda graph", "verify": "cuda graph", "extend": "draft extend cuda graph"}.get(
        runner, "draft cuda graph"
    )
    return f"Capture {label} begin. This can take up to several minutes. avail mem={fmt_gb(avail)} GB"


def capture_end(
    release: SGLangRelease, role: str, runner: str, bs: Sequence[int], elapsed: float, usage: float, avail: float
) -> str:
    bs_text = "[" + ", ".join(str(b) for b in bs) + "]"
    if is_new(release):
        kind = "decode" if runner == "draft_decode" else runner
        bs_part = f"bs={bs_text}, " if (release.key >= (0, 5, 23) and role == "target") else ""
        return (
            f"Capture {role} {kind} CUDA graph end. {bs_part}elapsed={elapsed:.2f} s, "
            f"mem usage={fmt_gb(usage)} GB, avail mem={fmt_gb(avail)} GB."
        )
    label = {"decode": "cuda graph", "verify": "cuda graph", "extend": "draft extend cuda graph"}.get(
        runner, "draft cuda graph"
    )
    return (
        f"Capture {label} end. Time elapsed: {elapsed:.2f} s. mem usage={fmt_gb(usage)} GB. "
        f"avail mem={fmt_gb(avail)} GB."
    )


def capture_bar_desc(bs: int, avail: float) -> str:
    return f"Capturing batches (bs={bs} avail_mem={fmt_gb(avail)} GB)"


def hint_block(release: SGLangRelease) -> str:
    if release.key >= (0, 5, 23):
        return (
            "Possible solutions:\n"
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
            "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
            "(Not recommended. Huge performance loss)"
        )
    return (
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)\n"
        "3. disable torch compile by not using --enable-torch-compile\n"
        "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)\n"
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose"
    )


def oom_message(
    gpu: int,
    tried_bytes: float,
    total_bytes: float,
    free_bytes: float,
    process_bytes: float,
    allocated_bytes: float,
    private_pool_bytes: float,
    reserved_unallocated_bytes: float,
) -> str:
    """PyTorch's CUDA OOM text (one line)."""
    return (
        f"CUDA out of memory. Tried to allocate {format_size(tried_bytes)}. GPU {gpu} has a total capacity of "
        f"{format_size(total_bytes)} of which {format_size(free_bytes)} is free. Including non-PyTorch memory, "
        f"this process has {format_size(process_bytes)} memory in use. Of the allocated memory "
        f"{format_size(allocated_bytes)} is allocated by PyTorch, with {format_size(private_pool_bytes)} allocated "
        f"in private pools (e.g., CUDA Graphs), and {format_size(reserved_unallocated_bytes)} is reserved by PyTorch "
        "but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def decode_batch(
    release: SGLangRelease,
    running: int,
    tokens: int,
    usage: float,
    accept_len: float | None,
    accept_rate: float | None,
    cuda_graph: bool,
    gen_throughput: float,
    queue: int,
) -> str:
    head = "Decode batch. " if release.key < (0, 5, 4) else "Decode batch, "
    spec = ""
    if accept_len is not None:
        spec = f"accept len: {accept_len:.2f}, "
        if release.key >= (0, 5, 4) and accept_rate is not None:
            spec += f"accept rate: {accept_rate:.2f}, "
    text = (
        f"{head}#running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, {spec}"
        f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {queue}"
    )
    return text if release.key >= (0, 5, 23) else text + ", "


def prefill_batch(
    release: SGLangRelease,
    new_seq: int,
    new_token: int,
    cached: int,
    usage: float,
    running: int,
    queue: int,
    pending: int,
    input_throughput: float,
) -> str:
    head = "Prefill batch. " if release.key < (0, 5, 4) else "Prefill batch, "
    text = (
        f"{head}#new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached}, token usage: {usage:.2f}, "
        f"#running-req: {running}, #queue-req: {queue}, "
    )
    if release.key >= (0, 5, 23):
        return (
            text + f"#pending-token: {pending}, cuda graph: False, input throughput (token/s): {input_throughput:.2f}"
        )
    return text


def stderr_fd() -> int:
    return sys.stderr.fileno() if sys.stderr is not None else 2
