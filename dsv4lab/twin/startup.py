"""What one scheduler rank does while SGLang starts: allocate, log, and either report ready or die.

Each rank runs in its own process and walks SGLang's startup for its GPU — distributed init, weight
loading, the KV pool, communication buffers and CUDA-graph capture (draft model steps where the release
puts them) — logging the lines SGLang logs with its rank prefix and sleeping for the (scaled) duration of
each phase. The allocations go through :class:`memsim.GpuMemory`, so an OOM happens where the memory runs
out; the rank then logs ``Scheduler hit an exception`` with the traceback SGLang would show and sends
SIGQUIT to the main process, as SGLang's ``run_scheduler_process`` does.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dsv4lab.config.versions import SGLangRelease
from dsv4lab.twin import logfmt
from dsv4lab.twin.kernels import KernelConfigs
from dsv4lab.twin.logfmt import LogWriter, Progress, Rank
from dsv4lab.twin.memsim import OutOfMemory, RankMemoryPlan
from dsv4lab.twin.settings import TwinSettings
from dsv4lab.twin.smi import write_gpu_state

__all__ = ["Lockstep", "PhaseTimes", "RankContext", "SchedulerFailure", "run_rank"]

GiB = 1024**3

#: How long (s, at time scale 1) a rank that fails in the same lock-stepped allocation as a tighter GPU
#: waits before reporting, per place in the order; the main process tears the tree down well before.
#: Not scaled: it is a race margin between processes, not a modelled duration.
TIE_BREAK_DELAY_S = 0.4


@dataclass(frozen=True)
class PhaseTimes:
    """Durations of startup phases at time scale 1 (seconds): tens of seconds in all, like a real launch."""

    init_s: float = 2.0
    weight_load_gib_per_s: float = 1.3
    kv_alloc_s: float = 1.5
    first_graph_s: float = 7.0
    other_graph_s: float = 0.25
    first_draft_graph_s: float = 3.0
    other_draft_graph_s: float = 0.12


#: How long a rank waits at a collective for the others before going on alone. SGLang would hang there
#: until NCCL's watchdog fires; here a rank that failed has already told the main process, which tears the
#: tree down, so this only bounds a wait nobody is left to end.
LOCKSTEP_TIMEOUT_S = 600.0


class Lockstep:
    """The collectives that keep SGLang's TP ranks in step, as one barrier shared by the forked ranks.

    Real ranks meet in an all-reduce of free memory before sizing the KV pool and in the collectives of
    graph capture; without that, a rank starved of CPU on a loaded machine falls behind and the memory one
    GPU shows no longer lines up with the phases rank 0 logs.
    """

    def __init__(self, ranks: int) -> None:
        self._barrier: threading.Barrier | None = (
            multiprocessing.get_context("fork").Barrier(ranks) if ranks > 1 else None
        )

    def meet(self) -> None:
        if self._barrier is None:
            return
        with contextlib.suppress(threading.BrokenBarrierError):
            self._barrier.wait(LOCKSTEP_TIMEOUT_S)


@dataclass(frozen=True)
class RankContext:
    """Everything a rank process needs (built in the main process before forking)."""

    rank: Rank
    settings: TwinSettings
    plan: RankMemoryPlan
    model_class: str
    draft_class: str
    kv_dtype: str
    kernels: KernelConfigs
    is_first: bool  # the node's first rank: progress bars, rank-0-only lines
    summary: str  # the max_total_num_tokens line (first rank logs it)
    mem_fraction_static: float
    main_pid: int
    times: PhaseTimes = PhaseTimes()
    lockstep: Lockstep = field(default_factory=lambda: Lockstep(1))


class SchedulerFailure(Exception):
    """A failure to report as SGLang does: the traceback text that follows ``Scheduler hit an exception:``."""

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text.splitlines()[-1] if traceback_text else "")
        self.traceback_text = traceback_text


_SITE = "/usr/local/lib/python3.12/dist-packages"


def _frames(frames: list[tuple[str, int, str, str]]) -> str:
    out = []
    for path, line, func, code in frames:
        out.append(f'  File "{_SITE}/{path}", line {line}, in {func}\n    {code}')
    return "\n".join(out)


def _capture_oom_traceback(release: SGLangRelease, oom: OutOfMemory, draft: bool) -> str:
    msg = logfmt.oom_message(
        oom.gpu,
        oom.tried_gib * GiB,
        oom.total_gib * GiB,
        oom.free_gib * GiB,
        oom.process_gib * GiB,
        oom.allocated_gib * GiB,
        oom.private_pool_gib * GiB,
        oom.reserved_unallocated_gib * GiB,
    )
    new = release.key >= (0, 5, 16)
    runner_file = (
        (
            "sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
            if draft
            else "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
        )
        if new
        else (
            "sglang/srt/speculative/eagle_draft_extend_cuda_graph_runner.py"
            if draft
            else "sglang/srt/model_executor/cuda_graph_runner.py"
        )
    )
    inner = _frames(
        [
            (runner_file, 412, "__init__", "self.capture()"),
            (runner_file, 538, "capture", "graph, output_buffers = self.capture_one_batch_size(bs, forward)"),
            ("torch/cuda/graphs.py", 186, "__exit__", "self.cuda_graph.capture_end()"),
        ]
    )
    outer = _frames(
        [
            ("sglang/srt/managers/scheduler.py", 3012, "run_scheduler_process", "scheduler = Scheduler("),
            ("sglang/srt/managers/scheduler.py", 356, "__init__", "self.init_model_worker()"),
            ("sglang/srt/model_executor/model_runner.py", 448, "initialize", "self.init_device_graphs()"),
            (runner_file, 416, "__init__", "raise Exception("),
        ]
    )
    return (
        f"Traceback (most recent call last):\n{inner}\ntorch.OutOfMemoryError: {msg}\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        f"Traceback (most recent call last):\n{outer}\n"
        f"Exception: Capture cuda graph failed: {msg}\n{logfmt.hint_block(release)}"
    )


def _plain_oom_traceback(oom: OutOfMemory, where: tuple[str, int, str, str]) -> str:
    msg = logfmt.oom_message(
        oom.gpu,
        oom.tried_gib * GiB,
        oom.total_gib * GiB,
        oom.free_gib * GiB,
        oom.process_gib * GiB,
        oom.allocated_gib * GiB,
        oom.private_pool_gib * GiB,
        oom.reserved_unallocated_gib * GiB,
    )
    frames = _frames(
        [
            ("sglang/srt/managers/scheduler.py", 3012, "run_scheduler_process", "scheduler = Scheduler("),
            where,
        ]
    )
    return f"Traceback (most recent call last):\n{frames}\ntorch.OutOfMemoryError: {msg}"


def _kv_error_traceback(release: SGLangRelease, f: float) -> str:
    if release.key >= (0, 5, 23):
        where = ("sglang/srt/model_executor/pool_configurator.py", 97, "__post_init__", "raise RuntimeError(")
        text = (
            f"Not enough memory. Please try to increase --mem-fraction-static. Current value: mem_fraction_static={f}"
        )
    else:
        where = ("sglang/srt/model_executor/model_runner.py", 1712, "init_memory_pool", "raise RuntimeError(")
        text = (
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: self.server_args.mem_fraction_static={f}"
        )
    frames = _frames(
        [("sglang/srt/managers/scheduler.py", 3012, "run_scheduler_process", "scheduler = Scheduler("), where]
    )
    return f"Traceback (most recent call last):\n{frames}\nRuntimeError: {text}"


def nccl_error_traceback() -> str:
    frames = _frames(
        [
            ("sglang/srt/managers/scheduler.py", 3012, "run_scheduler_process", "scheduler = Scheduler("),
            (
                "sglang/srt/distributed/parallel_state.py",
                1304,
                "init_distributed_environment",
                "torch.distributed.barrier()",
            ),
            ("torch/distributed/distributed_c10d.py", 4551, "barrier", "work = group.barrier(opts=opts)"),
        ]
    )
    return (
        f"Traceback (most recent call last):\n{frames}\n"
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.27.3\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error. \n"
        "Last error:\nsocketStartConnect: Connect to 127.0.0.1<45173> failed : Software caused connection abort"
    )


def serving_crash_traceback() -> str:
    frames = _frames(
        [
            ("sglang/srt/managers/scheduler.py", 3040, "run_scheduler_process", "scheduler.event_loop_overlap()"),
            ("sglang/srt/managers/scheduler.py", 1102, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
            ("sglang/srt/model_executor/model_runner.py", 2210, "forward", "output = self._forward_raw("),
        ]
    )
    return (
        f"Traceback (most recent call last):\n{frames}\n"
        "RuntimeError: CUDA error: an illegal memory access was encountered\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
        "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1"
    )


class _Clock:
    """Scaled sleeps (time scale x slow-start factor)."""

    def __init__(self, settings: TwinSettings) -> None:
        slow = settings.fault_named("slow_start")
        self.factor = settings.time_scale * (slow.value if slow else 1.0)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds * self.factor)


def report_failure(log: LogWriter, text: str, main_pid: int) -> None:
    """``Scheduler hit an exception: <traceback>``, then SIGQUIT to the main process (SGLang's way)."""
    log.log(f"Scheduler hit an exception: {text}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(main_pid, signal.SIGQUIT)


def run_rank(ctx: RankContext, on_ready: Callable[[], None]) -> None:
    """Walk the startup; on success call ``on_ready`` and return; on failure raise SchedulerFailure."""
    s = ctx.settings
    release = s.release
    log = LogWriter(release, ctx.rank)
    clock = _Clock(s)
    plan = ctx.plan
    mem = plan.memory(s.seed)
    t_scale = clock.factor
    state = s.state_dir

    def publish() -> None:
        write_gpu_state(state, ctx.main_pid, plan.gpu, mem.used_gib * 1024)

    publish()
    t0 = time.monotonic()
    log.log(logfmt.init_begin(release))
    clock.sleep(ctx.times.init_s)
    if s.fault_named("nccl_error") and ctx.rank.tp_rank == min(1, ctx.rank.tp_size - 1):
        raise SchedulerFailure(nccl_error_traceback())
    for line in logfmt.init_end(release, time.monotonic() - t0, plan.context_gib):
        log.log(line)

    # Target weights, in shards (rank 0 shows the shard bar, as SGLang's loader does).
    def load(gib: float, shards: int, cls: str) -> None:
        log.log(f"Load weight begin. avail mem={logfmt.fmt_gb(mem.free_gib)} GB")
        t = time.monotonic()
        before = mem.free_gib
        bar = Progress("Loading safetensors checkpoint shards", shards) if ctx.is_first and shards > 1 else None
        for _ in range(shards):
            try:
                mem.alloc(gib / shards)
            except OutOfMemory as oom:
                raise SchedulerFailure(
                    _plain_oom_traceback(
                        oom,
                        (
                            "sglang/srt/model_loader/loader.py",
                            611,
                            "load_weights_and_postprocess",
                            "model.load_weights(weights)",
                        ),
                    )
                ) from None
            clock.sleep(gib / shards / ctx.times.weight_load_gib_per_s)
            if bar:
                bar.update()
            publish()
        if bar:
            bar.close()
        log.log(logfmt.load_weight_end(release, time.monotonic() - t, cls, "fp8", mem.free_gib, before - mem.free_gib))

    load(plan.weights_gib, plan.weight_shards, ctx.model_class)
    spec = plan.draft_weights_gib > 0
    if spec and plan.draft_in_static:
        load(plan.draft_weights_gib, 1, ctx.draft_class)

    def kv_pool(gib: float, tokens: int, bytes_per_token: float) -> None:
        ctx.lockstep.meet()  # the all-reduce of free memory that sizes the pool
        if gib <= 0 or tokens <= 0:
            raise SchedulerFailure(_kv_error_traceback(release, ctx.mem_fraction_static))
        if release.key < (0, 5, 16) and ctx.is_first:
            log.log(f"Using KV cache dtype: {ctx.kv_dtype}")
        try:
            mem.alloc(gib)
        except OutOfMemory as oom:
            raise SchedulerFailure(
                _plain_oom_traceback(
                    oom, ("sglang/srt/mem_cache/memory_pool.py", 640, "_create_buffers", "torch.zeros(")
                )
            ) from None
        publish()  # the pool is one allocation: nvidia-smi sees it at once, the log lines come after
        clock.sleep(ctx.times.kv_alloc_s)
        log.log(logfmt.kv_allocated(release, ctx.kv_dtype, tokens, tokens * bytes_per_token / GiB))
        log.log(f"Memory pool end. avail mem={logfmt.fmt_gb(mem.free_gib)} GB")

    kv_pool(plan.kv_pool_gib, plan.kv_tokens, plan.kv_bytes_per_token)

    first_graph = True

    def capture(gp_index: int) -> None:
        nonlocal first_graph
        gp = plan.graphs[gp_index]
        draft = gp.role == "draft"
        if (draft and release.key >= (0, 5, 16)) and not ctx.is_first:
            show_lines = False  # 0.5.16+: draft capture lines come from rank 0 only
        else:
            show_lines = True
        if first_graph:
            ctx.lockstep.meet()  # capture's collectives start every rank together
        t = time.monotonic()
        before = mem.free_gib
        if show_lines:
            log.log(logfmt.capture_begin(release, gp.role, gp.runner, gp.tokens_per_req, gp.bs, mem.free_gib))
        if release.key < (0, 5, 16) and ctx.is_first and not draft:
            log.log("Capture cuda graph bs [" + ", ".join(str(b) for b in gp.bs) + "]")
        if first_graph:
            try:
                mem.alloc(plan.comm_gib)  # NCCL / custom all-reduce buffers registered at first capture
            except OutOfMemory as oom:
                raise SchedulerFailure(_capture_oom_traceback(release, oom, draft)) from None
            publish()
        bar = (
            Progress(logfmt.capture_bar_desc(gp.allocations[0][0], mem.free_gib), len(gp.allocations))
            if ctx.is_first
            else None
        )
        if first_graph:
            for line in ctx.kernels.log_lines():
                log.log(line)
            if s.fault_named("capture_hang"):
                while True:  # alive, no progress: what a hung custom all-reduce looks like
                    time.sleep(3600)
        for i, (bs, tensors) in enumerate(gp.allocations):
            if bar:
                bar.set_desc(logfmt.capture_bar_desc(bs, mem.free_gib))
            graph_time = (
                (ctx.times.first_draft_graph_s if draft else ctx.times.first_graph_s)
                if i == 0
                else (ctx.times.other_draft_graph_s if draft else ctx.times.other_graph_s)
            )
            for tensor in tensors:
                clock.sleep(graph_time / len(tensors))
                try:
                    mem.alloc(tensor, private_pool=True)
                except OutOfMemory as oom:
                    # Ranks are lock-stepped by the collectives inside capture; the tightest GPU reports first.
                    time.sleep(TIE_BREAK_DELAY_S * plan.tightness * min(1.0, max(t_scale, 0.25)))
                    raise SchedulerFailure(_capture_oom_traceback(release, oom, draft)) from None
                if len(tensors) > 1:
                    publish()  # the largest graph's buffers one by one: memory climbs to the peak (or the OOM)
            publish()
            if bar:
                bar.update()
        if bar:
            bar.close()
        first_graph = False
        if show_lines:
            log.log(
                logfmt.capture_end(
                    release, gp.role, gp.runner, gp.bs, time.monotonic() - t, before - mem.free_gib, mem.free_gib
                )
            )

    targets = [i for i, g in enumerate(plan.graphs) if g.role == "target"]
    drafts = [i for i, g in enumerate(plan.graphs) if g.role == "draft"]
    for i in targets:
        capture(i)
    if spec and not plan.draft_in_static:
        # 0.4.x/0.5.4: the draft worker is built after the target's graphs, from the slack.
        load(plan.draft_weights_gib, 1, ctx.draft_class)
        kv_pool(plan.draft_kv_gib, plan.kv_tokens, plan.draft_kv_gib * GiB / max(plan.kv_tokens, 1))
    for i in drafts:
        capture(i)
    if ctx.is_first:
        log.log(ctx.summary.replace("{avail}", logfmt.fmt_gb(mem.free_gib)))
    publish()
    on_ready()


def _write_ready(fd: int) -> None:
    os.write(fd, b"R")


def rank_main(ctx: RankContext, ready_fd: int) -> None:
    """Body of a forked rank process: start, report ready through the pipe, then idle until killed."""
    log = LogWriter(ctx.settings.release, ctx.rank)
    crash = {"now": False}

    def on_usr1(signum: int, frame: object) -> None:
        crash["now"] = True

    signal.signal(signal.SIGUSR1, on_usr1)
    try:
        run_rank(ctx, lambda: _write_ready(ready_fd))
    except SchedulerFailure as exc:
        report_failure(log, exc.traceback_text, ctx.main_pid)
        while True:
            time.sleep(3600)  # the main process kills the tree
    while True:
        signal.pause()  # mostly sleeping: a rank costs nothing while the main process serves
        if crash["now"]:
            crash["now"] = False
            report_failure(log, serving_crash_traceback(), ctx.main_pid)
