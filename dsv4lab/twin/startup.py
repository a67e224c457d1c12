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
from dsv4lab.twin.clock import TwinClock
from dsv4lab.twin.kernels import KernelConfigs
from dsv4lab.twin.logfmt import LogWriter, Progress, Rank
from dsv4lab.twin.memsim import GraphPlan, OutOfMemory, RankMemoryPlan
from dsv4lab.twin.settings import TwinSettings
from dsv4lab.twin.smi import write_gpu_state

__all__ = ["Lockstep", "PhaseTimes", "RankContext", "SchedulerFailure", "run_rank"]

GiB = 1024**3

#: How long (s, at time scale 1) a rank that fails in the same lock-stepped allocation as a tighter GPU
#: waits before reporting, per place in the order; the main process tears the tree down well before.
#: Not scaled: it is a race margin between processes, not a modelled duration.
#: How long a rank whose allocation failed waits before reporting, when a GPU with less free memory is in the
#: same lock-stepped step (its rank fails at this allocation or before it and reports; the main process then
#: ends the tree, so this rank reports only if that did not happen): SGLang's log names the tightest GPU.
TIGHTER_FAILS_FIRST_WAIT_S = 20.0


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

    def meet(self, clock: TwinClock | None = None) -> None:
        """Wait for every rank; with ``clock``, every rank leaves at the modelled time of the last to arrive
        (a second meeting, so that no rank reads the others' times while one has already moved on)."""
        if self._barrier is None:
            return
        if clock is not None:
            clock.rank_done()  # waiting here: the others must be able to come
        with contextlib.suppress(threading.BrokenBarrierError):
            self._barrier.wait(LOCKSTEP_TIMEOUT_S)
            if clock is not None:
                clock.catch_up()
                self._barrier.wait(LOCKSTEP_TIMEOUT_S)
        if clock is not None:
            clock.rank_done(False)


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
    clock: TwinClock = field(default_factory=lambda: TwinClock(None))
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
    """A phase's modelled duration on the twin's clock (times the slow-start factor): slept when paced,
    counted at once in virtual time."""

    def __init__(self, settings: TwinSettings, clock: TwinClock) -> None:
        slow = settings.fault_named("slow_start")
        self.factor = slow.value if slow else 1.0
        self.clock = clock

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.clock.sleep(seconds * self.factor)


def report_failure(log: LogWriter, text: str, main_pid: int) -> None:
    """``Scheduler hit an exception: <traceback>``, then SIGQUIT to the main process (SGLang's way)."""
    log.log(f"Scheduler hit an exception: {text}")
    with contextlib.suppress(ProcessLookupError):
        os.kill(main_pid, signal.SIGQUIT)


#: Where SGLang's traceback points when the weights or the KV pool do not fit.
_LOAD_WEIGHTS_FRAME = (
    "sglang/srt/model_loader/loader.py",
    611,
    "load_weights_and_postprocess",
    "model.load_weights(weights)",
)
_KV_POOL_FRAME = ("sglang/srt/mem_cache/memory_pool.py", 640, "_create_buffers", "torch.zeros(")


def run_rank(ctx: RankContext, on_ready: Callable[[], None]) -> None:
    """Walk the startup; on success call ``on_ready`` and return; on failure raise SchedulerFailure."""
    startup = _RankStartup(ctx)
    plan = ctx.plan
    startup.publish()
    startup.init_distributed()
    startup.load_weights(plan.weights_gib, plan.weight_shards, ctx.model_class)
    spec = plan.draft_weights_gib > 0
    if spec and plan.draft_in_static:
        startup.load_weights(plan.draft_weights_gib, 1, ctx.draft_class)
    startup.kv_pool(plan.kv_pool_gib, plan.kv_tokens, plan.kv_bytes_per_token)
    for gp in plan.graphs:
        if gp.role == "target":
            startup.capture(gp)
    if spec and not plan.draft_in_static:
        # 0.4.x/0.5.4: the draft worker is built after the target's graphs, from the slack.
        startup.load_weights(plan.draft_weights_gib, 1, ctx.draft_class)
        startup.kv_pool(plan.draft_kv_gib, plan.kv_tokens, plan.draft_kv_gib * GiB / max(plan.kv_tokens, 1))
    for gp in plan.graphs:
        if gp.role == "draft":
            startup.capture(gp)
    if ctx.is_first:
        startup.log.log(ctx.summary.replace("{avail}", logfmt.fmt_gb(startup.mem.free_gib)))
    startup.publish()
    on_ready()


class _RankStartup:
    """One rank's startup, phase by phase: each allocates on the simulated GPU, sleeps its scaled duration,
    logs SGLang's lines and publishes the memory to the nvidia-smi stand-in; an OOM raises SchedulerFailure
    with the traceback SGLang shows in that phase."""

    def __init__(self, ctx: RankContext) -> None:
        self.ctx = ctx
        self.release = ctx.settings.release
        self.log = LogWriter(self.release, ctx.rank, clock=ctx.clock)
        self.clock = _Clock(ctx.settings, ctx.clock)
        self.mem = ctx.plan.memory(ctx.settings.seed)
        self.first_graph = True
        #: (modelled time, MiB in use) at every change: the stand-in samples it on the twin's own clock.
        self.history: list[tuple[float, float]] = []

    def publish(self) -> None:
        ctx = self.ctx
        at, used = ctx.clock.stamp(), self.mem.used_gib * 1024
        self.history.append((at, used))
        write_gpu_state(ctx.settings.state_dir, ctx.main_pid, ctx.plan.gpu, used, at=at, history=self.history)

    def init_distributed(self) -> None:
        ctx = self.ctx
        t0 = self.ctx.clock.now()
        self.log.log(logfmt.init_begin(self.release))
        self.clock.sleep(ctx.times.init_s)
        if ctx.settings.fault_named("nccl_error") and ctx.rank.tp_rank == min(1, ctx.rank.tp_size - 1):
            raise SchedulerFailure(nccl_error_traceback())
        for line in logfmt.init_end(self.release, self.ctx.clock.now() - t0, ctx.plan.context_gib):
            self.log.log(line)

    def load_weights(self, gib: float, shards: int, cls: str) -> None:
        """A model's weights, in shards (rank 0 shows the shard bar, as SGLang's loader does)."""
        ctx, mem = self.ctx, self.mem
        self.log.log(f"Load weight begin. avail mem={logfmt.fmt_gb(mem.free_gib)} GB")
        t = self.ctx.clock.now()
        before = mem.free_gib
        bar = Progress("Loading safetensors checkpoint shards", shards) if ctx.is_first and shards > 1 else None
        for _ in range(shards):
            try:
                mem.alloc(gib / shards)
            except OutOfMemory as oom:
                raise SchedulerFailure(_plain_oom_traceback(oom, _LOAD_WEIGHTS_FRAME)) from None
            self.clock.sleep(gib / shards / ctx.times.weight_load_gib_per_s)
            if bar:
                bar.update()
            self.publish()
        if bar:
            bar.close()
        self.log.log(
            logfmt.load_weight_end(
                self.release, self.ctx.clock.now() - t, cls, "fp8", mem.free_gib, before - mem.free_gib
            )
        )

    def kv_pool(self, gib: float, tokens: int, bytes_per_token: float) -> None:
        ctx = self.ctx
        ctx.lockstep.meet(ctx.clock)  # the all-reduce of free memory that sizes the pool
        if gib <= 0 or tokens <= 0:
            raise SchedulerFailure(_kv_error_traceback(self.release, ctx.mem_fraction_static))
        if self.release.key < (0, 5, 16) and ctx.is_first:
            self.log.log(f"Using KV cache dtype: {ctx.kv_dtype}")
        try:
            self.mem.alloc(gib)
        except OutOfMemory as oom:
            self.let_tighter_gpus_fail_first()  # after the all-reduce above every rank allocates together
            raise SchedulerFailure(_plain_oom_traceback(oom, _KV_POOL_FRAME)) from None
        self.publish()  # the pool is one allocation: nvidia-smi sees it at once, the log lines come after
        self.clock.sleep(ctx.times.kv_alloc_s)
        self.log.log(logfmt.kv_allocated(self.release, ctx.kv_dtype, tokens, tokens * bytes_per_token / GiB))
        self.log.log(f"Memory pool end. avail mem={logfmt.fmt_gb(self.mem.free_gib)} GB")

    def capture(self, gp: GraphPlan) -> None:
        """One graph runner's capture: begin line, every batch size's graphs (rank 0's progress bar), end line."""
        release, mem = self.release, self.mem
        draft = gp.role == "draft"
        show_lines = not (draft and release.key >= (0, 5, 16)) or self.ctx.is_first  # 0.5.16+: draft from rank 0
        first = self.first_graph
        if first:
            self.ctx.lockstep.meet(self.ctx.clock)  # capture's collectives start every rank together
        t = self.ctx.clock.now()
        before = mem.free_gib
        if show_lines:
            self.log.log(logfmt.capture_begin(release, gp.role, gp.runner, gp.tokens_per_req, gp.bs, mem.free_gib))
        if release.key < (0, 5, 16) and self.ctx.is_first and not draft:
            self.log.log("Capture cuda graph bs [" + ", ".join(str(b) for b in gp.bs) + "]")
        if first:
            self.register_buffers(draft)
        bar = (
            Progress(logfmt.capture_bar_desc(gp.allocations[0][0], mem.free_gib), len(gp.allocations))
            if self.ctx.is_first
            else None
        )
        if first:
            self.first_capture_starts()
        for i, (bs, tensors) in enumerate(gp.allocations):
            if bar:
                bar.set_desc(logfmt.capture_bar_desc(bs, mem.free_gib))
            self.capture_graph(tensors, self.graph_time(draft, first_of_runner=i == 0), draft)
            if bar:
                bar.update()
        if bar:
            bar.close()
        self.first_graph = False
        if show_lines:
            used = before - mem.free_gib
            self.log.log(
                logfmt.capture_end(release, gp.role, gp.runner, gp.bs, self.ctx.clock.now() - t, used, mem.free_gib)
            )

    def register_buffers(self, draft: bool) -> None:
        """NCCL / custom all-reduce buffers, registered at the first capture."""
        try:
            self.mem.alloc(self.ctx.plan.comm_gib)
        except OutOfMemory as oom:
            self.let_tighter_gpus_fail_first()
            raise SchedulerFailure(_capture_oom_traceback(self.release, oom, draft)) from None
        self.publish()

    def let_tighter_gpus_fail_first(self) -> None:
        """Before reporting an OOM in a lock-stepped step, give a GPU with less free memory (which fails at the
        same allocation or earlier) the time to report it: a fixed order, not the luck of a loaded machine."""
        if self.ctx.plan.tightness == 0:
            return
        deadline = time.monotonic() + TIGHTER_FAILS_FIRST_WAIT_S
        while time.monotonic() < deadline:  # the main process ends this process once the tighter rank reports
            time.sleep(0.05)

    def first_capture_starts(self) -> None:
        """The kernel-config lines the first GEMMs print; with the capture_hang fault, no progress from here."""
        for line in self.ctx.kernels.log_lines():
            self.log.log(line)
        if self.ctx.settings.fault_named("capture_hang"):
            while True:  # alive, no progress: what a hung custom all-reduce looks like
                time.sleep(3600)

    def graph_time(self, draft: bool, *, first_of_runner: bool) -> float:
        times = self.ctx.times
        if first_of_runner:
            return times.first_draft_graph_s if draft else times.first_graph_s
        return times.other_draft_graph_s if draft else times.other_graph_s

    def capture_graph(self, tensors: tuple[float, ...], graph_time: float, draft: bool) -> None:
        """One batch size's graph, tensor by tensor into the private pool."""
        for tensor in tensors:
            self.clock.sleep(graph_time / len(tensors))
            try:
                self.mem.alloc(tensor, private_pool=True)
            except OutOfMemory as oom:
                self.let_tighter_gpus_fail_first()  # ranks are lock-stepped by capture's collectives
                raise SchedulerFailure(_capture_oom_traceback(self.release, oom, draft)) from None
            if len(tensors) > 1:
                self.publish()  # the largest graph's buffers one by one: memory climbs to the peak (or the OOM)
        self.publish()


def _write_ready(fd: int) -> None:
    os.write(fd, b"R")


def rank_main(ctx: RankContext, ready_fd: int) -> None:
    """Body of a forked rank process: start, report ready through the pipe, then idle until killed."""
    ctx.clock.as_rank(ctx.rank.gpu)
    log = LogWriter(ctx.settings.release, ctx.rank, clock=ctx.clock)
    crash = {"now": False}

    def on_usr1(signum: int, frame: object) -> None:
        crash["now"] = True

    signal.signal(signal.SIGUSR1, on_usr1)
    try:
        run_rank(ctx, lambda: _write_ready(ready_fd))
        ctx.clock.rank_done()
    except SchedulerFailure as exc:
        ctx.clock.freeze()
        report_failure(log, exc.traceback_text, ctx.main_pid)
        while True:
            time.sleep(3600)  # the main process kills the tree
    while True:
        signal.pause()  # mostly sleeping: a rank costs nothing while the main process serves
        if crash["now"]:
            crash["now"] = False
            report_failure(log, serving_crash_traceback(), ctx.main_pid)
