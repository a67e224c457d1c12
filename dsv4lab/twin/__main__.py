"""``python -m dsv4lab.twin``: the main process of the twin, in SGLang's launch order.

1. Parse SGLang's flags for the emulated release (argparse errors exit 2) and log ``server_args``.
2. Fork the detokenizer and one scheduler process per local rank; each walks its GPU's startup
   (:mod:`.startup`) and reports ready through a pipe or fails with SIGQUIT to this process.
3. In the launch phase a SIGQUIT means a child failed: log it, ``kill_process_tree`` (logged from
   0.5.16), SIGKILL the tree and this process — exit status 137, and a log that never changes again.
4. Only when every rank is ready does the HTTP port listen (uvicorn's lines), then the warmup request,
   then ``The server is fired up and ready to roll!``. Nodes with rank >= 1 serve a dummy health server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from dsv4lab.config.hardware import ModelProfile, model_profile
from dsv4lab.errors import DSV4LabError
from dsv4lab.model.memory import Preflight, preflight
from dsv4lab.twin import http as twin_http
from dsv4lab.twin.args import TwinArgs, parse_args
from dsv4lab.twin.clock import TwinClock
from dsv4lab.twin.kernels import find_kernel_configs
from dsv4lab.twin.logfmt import LogWriter, Rank
from dsv4lab.twin.memsim import plan_rank
from dsv4lab.twin.procs import Child, fork_child, kill_process_tree
from dsv4lab.twin.profiler import Profiler
from dsv4lab.twin.scheduler import Scheduler, SchedulerLimits
from dsv4lab.twin.settings import TwinSettings
from dsv4lab.twin.smi import RELEASE_S, release_state, write_main_state
from dsv4lab.twin.startup import Lockstep, PhaseTimes, RankContext, rank_main
from dsv4lab.twin.timing import TimingModel

#: SGLang polls model info once a second, up to 120 times, before its warmup request.
WARMUP_TRIES = 120
WARMUP_REQUEST_TIMEOUT_S = 600.0
STATE_INTERVAL_S = 1.0

_KV_DTYPES = {
    "fp8_e4m3": "torch.float8_e4m3fn",
    "fp8_e5m2": "torch.float8_e5m2",
    "bf16": "torch.bfloat16",
    "bfloat16": "torch.bfloat16",
}


def _kv_dtype(args: TwinArgs, model: ModelProfile) -> str:
    chosen = args.config.kv_cache_dtype
    if chosen is None:
        return "torch.float8_e4m3fn" if model.name.startswith("deepseek-v4") else "torch.bfloat16"
    return _KV_DTYPES.get(chosen, "torch.uint8")


def _server_args(args: TwinArgs, p: Preflight, context_len: int) -> dict[str, Any]:
    v = dict(args.values)
    s = p.settings
    c = args.config
    out: dict[str, Any] = {
        "model_path": c.model_path,
        "tokenizer_path": v.get("tokenizer_path") or c.model_path,
        "served_model_name": c.name,
        "host": c.host,
        "port": c.port,
        "tp_size": c.tp,
        "dp_size": c.dp,
        "pp_size": v.get("pp_size", 1),
        "ep_size": v.get("ep_size", 1),
        "mem_fraction_static": s.mem_fraction_static,
        "max_running_requests": s.max_running_requests,
        "max_total_tokens": v.get("max_total_tokens"),
        "chunked_prefill_size": s.chunked_prefill_size,
        "max_prefill_tokens": v.get("max_prefill_tokens"),
        "context_length": c.context_length,
        "kv_cache_dtype": v.get("kv_cache_dtype"),
        "quantization": c.quantization,
        "trust_remote_code": c.trust_remote_code,
        "enable_metrics": c.enable_metrics,
        "disable_cuda_graph": c.disable_cuda_graph,
    }
    if args.config.speculative is not None:
        out["speculative_algorithm"] = c.speculative.algorithm if c.speculative else None
    if p.settings.speculative is not None:
        sp = p.settings.speculative
        out.update(
            speculative_num_steps=sp.num_steps,
            speculative_eagle_topk=sp.eagle_topk,
            speculative_num_draft_tokens=sp.num_draft_tokens,
            speculative_draft_model_path=sp.draft_model_path or c.model_path,
        )
    else:
        out["speculative_algorithm"] = None
    new_flags = tuple(int(x) for x in p.sglang_version.split(".")) >= (0, 5, 16)
    graph_key = "cuda_graph_max_bs_decode" if new_flags else "cuda_graph_max_bs"
    out[graph_key] = s.cuda_graph_max_bs or None
    out[graph_key.replace("max_bs", "bs")] = list(s.capture_bs) or None
    for k in (
        "attention_backend",
        "moe_runner_backend",
        "log_level",
        "decode_log_interval",
        "skip_server_warmup",
        "swa_full_tokens_ratio",
        "disable_radix_cache",
        "watchdog_timeout",
        "page_size",
        "enable_dp_attention",
        "random_seed",
        "nnodes",
        "node_rank",
        "dist_init_addr",
        "stream_interval",
        "schedule_conservativeness",
    ):
        out[k] = v.get(k)
    out["api_key"] = "***" if v.get("api_key") else None
    out["context_len"] = context_len
    return out


def _format_server_args(args: dict[str, Any], new_style: bool) -> str:
    if new_style:
        return f"server_args={args!r}"
    return "server_args=ServerArgs(" + ", ".join(f"{k}={val!r}" for k, val in args.items()) + ")"


class Twin:
    """The main process: owns the children, the launch-phase wait and the serving loop."""

    def __init__(self, settings: TwinSettings, args: TwinArgs, model: ModelProfile, p: Preflight) -> None:
        self.settings = settings
        self.args = args
        self.model = model
        self.p = p
        self.release = settings.release
        c = args.config
        self.clock = TwinClock(settings.pace, ranks=c.dp * (c.tp // c.nnodes))
        self.log = LogWriter(self.release, clock=self.clock)
        self.children: list[Child] = []
        self.rank_children: list[Child] = []
        self.pid = os.getpid()
        self.context_len = c.context_length or model.default_context_length
        self.kernels = find_kernel_configs(settings.kernel_config_dir, settings.hardware, model)
        self.tp_local = c.tp // c.nnodes

    # -- teardown -------------------------------------------------------------------------------------

    def die(self, *, include_parent: bool = True) -> None:
        # The GPUs read as in use until the driver has released the killed processes' memory.
        release_state(
            self.settings.state_dir, self.pid, RELEASE_S * (self.settings.pace or 1.0), died_at=self.clock.stamp()
        )
        kill_process_tree(
            self.children, self.log, include_parent=include_parent, logs_call=self.release.logs_kill_process_tree
        )

    def _launch_sigquit(self, signum: int, frame: object) -> None:
        self.log.log("Received sigquit from a child process. It usually means the child failed.")
        self.die()

    # -- launch ------------------------------------------------------------------------------------------

    def spawn(self) -> list[int]:
        c = self.args.config
        s = self.p.settings
        summary = (
            f"max_total_num_tokens={self.max_total_tokens}, chunked_prefill_size={s.chunked_prefill_size}, "
            f"max_prefill_tokens={self.args.max_prefill_tokens}, max_running_requests={s.max_running_requests}, "
            f"context_len={self.context_len}, available_gpu_mem={{avail}} GB"
        )
        self.children.append(fork_child("detokenizer", _sleep_forever))
        fds = []
        n_local = c.dp * self.tp_local
        lockstep = Lockstep(n_local)
        for i in range(n_local):
            dp_rank, local = divmod(i, self.tp_local)
            rank = Rank(
                gpu=i,
                tp_rank=c.node_rank * self.tp_local + local,
                tp_size=c.tp,
                dp_rank=dp_rank,
                dp_size=c.dp,
                ep_size=int(self.args.values.get("ep_size") or 1),
            )
            ctx = RankContext(
                rank=rank,
                settings=self.settings,
                plan=plan_rank(self.p, i, self.settings.hardware, self.model, self.release),
                model_class=self.model.architecture or "DeepseekV4ForCausalLM",
                draft_class=(self.model.architecture or "DeepseekV4ForCausalLM") + "NextN",
                kv_dtype=_kv_dtype(self.args, self.model),
                kernels=self.kernels,
                is_first=i == 0,
                summary=summary,
                mem_fraction_static=s.mem_fraction_static,
                main_pid=self.pid,
                clock=self.clock,
                times=PhaseTimes(),
                lockstep=lockstep,
            )
            r, w = os.pipe()

            def body(ctx: RankContext = ctx, w: int = w) -> None:
                rank_main(ctx, w)

            child = fork_child(f"scheduler_{i}", body)
            os.close(w)
            self.children.append(child)
            self.rank_children.append(child)
            fds.append(r)
        return fds

    @property
    def max_total_tokens(self) -> int:
        cap = self.args.max_total_tokens
        return min(self.p.kv_tokens, cap) if cap else self.p.kv_tokens

    def wait_ready(self, fds: list[int]) -> bool:
        """Block until every rank is ready (True) or one died without SIGQUIT (False). No overall timeout:
        like SGLang, a hung capture hangs the launch; watchers must time it out."""
        pending = {fd: child for fd, child in zip(fds, self.rank_children, strict=False)}
        silent = self.settings.fault_named("silent_death")
        t = PhaseTimes()
        kill_at = None  # on the modelled clock
        if silent is not None:
            load_s = self.model.weights_gib(self.args.config.tp) / t.weight_load_gib_per_s
            kill_at = self.clock.now() + t.init_s + silent.value * load_s
        while pending:
            timeout = 1.0 if kill_at is None else 0.005
            try:
                ready, _, _ = select.select(list(pending), [], [], timeout)
            except InterruptedError:
                continue
            if kill_at is not None and self.clock.now() >= kill_at:
                for child in self.children:  # silent death: no message from anyone
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(child.pid, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)
            for fd in ready:
                data = os.read(fd, 1)
                child = pending.pop(fd)
                os.close(fd)
                if data != b"R":
                    self._rank_died(child)
                    return False
        return True

    def _rank_died(self, child: Child) -> None:
        code: int | str = "unknown"
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(child.pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        index = self.rank_children.index(child)
        if self.release.key >= (0, 5, 23):
            self.log.log(
                f"Rank {index} scheduler died during initialization (exit code: {code}). If exit code is -9 "
                "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check."
            )
        else:
            self.log.log(f"Rank {index} scheduler is dead. Please check if there are relevant logs.")
            self.log.log(f"Exit code: {code}")

    # -- serving -------------------------------------------------------------------------------------------

    async def serve(self) -> int:
        loop = asyncio.get_running_loop()
        stop = self._serving_signals(loop)
        profiler = Profiler(self.settings.hardware)
        scheduler = self._scheduler(profiler)
        state = self._server_state(scheduler, profiler)
        scheduler.start()
        app = twin_http.build_app(state)
        self.log.uvicorn(f"Started server process [{self.pid}]")
        self.log.uvicorn("Waiting for application startup.")
        self.log.uvicorn("Application startup complete.")
        runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        if not await self._listen(runner):
            return 1
        c = self.args.config
        self.log.uvicorn(f"Uvicorn running on http://{c.host}:{c.port} (Press CTRL+C to quit)")
        publisher = loop.create_task(self._publish_state(scheduler))
        if not self.args.skip_server_warmup:
            ok = await self._warmup(c.host, c.port)
            if not ok:
                self.die()
        state.ready = True
        self.log.log("The server is fired up and ready to roll!")
        self._schedule_crash(loop)
        await stop.wait()
        publisher.cancel()
        await runner.cleanup()
        self.die(include_parent=False)
        return 0

    def _serving_signals(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """Once serving, SIGQUIT still means a child failed (the tree dies); SIGTERM and SIGINT drain and stop:
        the event they set."""
        stop = asyncio.Event()

        def running_sigquit() -> None:
            self.log.log(
                f"SIGQUIT received. signum={int(signal.SIGQUIT)}, frame=None. It usually means one child failed."
            )
            self.die()

        def sigterm() -> None:
            self.log.log(
                f"SIGTERM received. signum={int(signal.SIGTERM)} frame=None. Draining requests and shutting down..."
            )
            stop.set()

        loop.add_signal_handler(signal.SIGQUIT, running_sigquit)
        loop.add_signal_handler(signal.SIGTERM, sigterm)
        loop.add_signal_handler(signal.SIGINT, sigterm)
        return stop

    def _scheduler(self, profiler: Profiler) -> Scheduler:
        """The serving model: timing of the hardware and config, the scheduler's limits, rank 0's batch log."""
        c = self.args.config
        s = self.p.settings
        timing = TimingModel(self.settings.hardware, self.model, c.tp, s.speculative, self.kernels.tuned)
        spec = s.speculative
        limits = SchedulerLimits(
            max_running_requests=s.max_running_requests,
            max_total_tokens=self.max_total_tokens,
            chunked_prefill_size=s.chunked_prefill_size if s.chunked_prefill_size > 0 else 1 << 30,
            max_graph_bs=s.cuda_graph_max_bs,
            decode_log_interval=self.args.decode_log_interval,
            accept_alpha=max(0.0, min(1.0, self.model.mtp_accept_mean - 1.0)),
            num_draft_steps=(spec.num_steps or 1) if spec else 0,
        )
        rank0_log = LogWriter(self.release, Rank(gpu=0, tp_rank=0, tp_size=c.tp, dp_size=c.dp), clock=self.clock)

        def on_step(start: float, cost: Any, duration: float) -> None:
            if profiler.record(start, cost, duration):
                path = profiler.stop()
                self.log.log(f"Profiling done. Traces are saved to: {path.parent}")

        return Scheduler(timing, limits, self.release, rank0_log, self.clock, self.settings.seed, on_step)

    def _server_state(self, scheduler: Scheduler, profiler: Profiler) -> twin_http.ServerState:
        """What the endpoints answer from: the resolved args, the memory figures, the twin's own facts."""
        c = self.args.config
        g0 = self.p.per_gpu[0]
        return twin_http.ServerState(
            release=self.release,
            scheduler=scheduler,
            profiler=profiler,
            log=self.log,
            model_path=c.model_path,
            served_model_name=c.name,
            context_len=self.context_len,
            max_total_num_tokens=self.max_total_tokens,
            server_args=_server_args(self.args, self.p, self.context_len),
            memory_usage=self._memory_usage(),
            twin={
                "hardware": self.settings.hardware.name,
                "clock": self.clock.mode,
                "pace": self.settings.pace,
                "fault": str(self.settings.fault) if self.settings.fault else None,
                "seed": self.settings.seed,
                "sglang_version": self.release.version,
                "fp8_kernel_configs_tuned": self.kernels.tuned,
                "kv_pool_gib": round(g0.kv_pool_gib, 3),
            },
            architecture=self.model.architecture or "DeepseekV4ForCausalLM",
            enable_metrics=c.enable_metrics,
            api_key=self.args.api_key,
        )

    async def _listen(self, runner: web.AppRunner) -> bool:
        """Bind the port; a port in use ends the twin as uvicorn ends (its error lines, shutdown, exit 1)."""
        c = self.args.config
        site = web.TCPSite(runner, c.host, c.port, backlog=4096)
        try:
            if self.settings.fault_named("port_in_use"):
                raise OSError(98, "address already in use")
            await site.start()
        except OSError as exc:
            reason = exc.strerror.lower() if exc.strerror else str(exc)
            self.log.uvicorn(
                f"[Errno {exc.errno}] error while attempting to bind on address ('{c.host}', {c.port}): {reason}",
                level="ERROR",
            )
            self.log.uvicorn("Waiting for application shutdown.")
            self.log.uvicorn("Application shutdown complete.")
            await runner.cleanup()
            self.die(include_parent=False)
            return False
        return True

    def _schedule_crash(self, loop: asyncio.AbstractEventLoop) -> None:
        """The crash_serving fault: rank 0's scheduler dies that many (scaled) seconds after ready."""
        crash = self.settings.fault_named("crash_serving")
        if crash is not None and self.rank_children:
            pid = self.rank_children[0].pid
            # After that many modelled seconds; an idle twin's virtual time follows the wall clock.
            loop.call_later(crash.value * (self.settings.pace or 1.0), lambda: _signal(pid, signal.SIGUSR1))

    async def _warmup(self, host: str, port: int) -> bool:
        target = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - comparing, not binding
        base = f"http://{target}:{port}"
        headers = {"Authorization": f"Bearer {self.args.api_key}"} if self.args.api_key else {}
        info = self.release.model_info_path
        timeout = aiohttp.ClientTimeout(total=WARMUP_REQUEST_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            for _ in range(WARMUP_TRIES):
                try:
                    async with session.get(base + info) as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(1.0)
            payload = {
                "text": "The capital city of France is",
                "sampling_params": {"temperature": 0, "max_new_tokens": 8},
            }
            try:
                async with session.post(base + "/generate", json=payload) as r:
                    await r.read()
                    if r.status == 200:
                        return True
                    err = f"status {r.status}"
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                err = repr(exc)
        self.log.log(f"Initialization failed. warmup error: {err}")
        return False

    async def _publish_state(self, scheduler: Scheduler) -> None:
        last_busy, last_t = 0.0, time.monotonic()
        gpus = list(range(self.args.config.dp * self.tp_local))
        while True:
            now = time.monotonic()
            util = min(100.0, 100.0 * (scheduler.stats.busy_s - last_busy) / max(now - last_t, 1e-6))
            last_busy, last_t = scheduler.stats.busy_s, now
            # Off the event loop: a rename-over on a busy disk can block for a good part of a second, and
            # the loop it blocks is the one that paces the modelled GPU.
            await asyncio.to_thread(
                write_main_state,
                self.settings.state_dir,
                self.pid,
                self.settings.hardware.name,
                dict.fromkeys(gpus, util),
                gpus,
                port=self.args.config.port,
                clock=self.clock.state(),
            )
            await asyncio.sleep(STATE_INTERVAL_S)

    def _memory_usage(self) -> dict[str, Any]:
        g = self.p.per_gpu[0]
        graph = {n.runner if n.runner != "verify" else "target_verify": round(n.gib, 2) for n in self.p.graphs}
        weight = round(g.weights_gib + (g.draft_weights_gib if self.release.draft_in_static else 0.0), 2)
        if self.release.key >= (0, 5, 23):
            return {
                "weight": weight,
                "kvcache": round(g.kv_pool_gib, 2),
                "startup_available": round(g.headroom_gib, 2),
                "token_capacity": self.max_total_tokens,
                "token_capacity_swa": None,
                "graph": graph,
            }
        return {
            "weight": weight,
            "kvcache": round(g.kv_pool_gib, 2),
            "token_capacity": self.max_total_tokens,
            "graph": round(sum(graph.values()), 2),
        }

    async def serve_dummy_health(self) -> int:
        c = self.args.config
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGQUIT, lambda: self.die())
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        runner = web.AppRunner(twin_http.build_dummy_health_app(self.log), handle_signals=False, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, c.host, c.port).start()
        await stop.wait()
        await runner.cleanup()
        self.die(include_parent=False)
        return 0


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _sleep_forever() -> None:
    while True:
        signal.pause()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        settings = TwinSettings.from_env()
    except DSV4LabError as exc:
        sys.stderr.write(f"dsv4lab twin: {exc}\n")
        return 2
    args = parse_args(sys.argv[1:] if argv is None else argv, settings.release)
    log = LogWriter(settings.release)
    try:
        model = model_profile(args.config.model_path)
        p = preflight(args.config, settings.hardware, model, sglang_version=settings.release)
    except DSV4LabError as exc:
        log.log(f"Error: {exc}")
        return 1
    for w in args.warnings:
        log.log(w)
    twin = Twin(settings, args, model, p)
    twin.log.log(_format_server_args(_server_args(args, p, twin.context_len), settings.release.key >= (0, 5, 23)))
    signal.signal(signal.SIGQUIT, twin._launch_sigquit)
    fds = twin.spawn()
    write_main_state(
        settings.state_dir,
        twin.pid,
        settings.hardware.name,
        {},
        list(range(len(twin.rank_children))),
        port=args.config.port,
        clock=twin.clock.state(),
    )
    if not twin.wait_ready(fds):
        twin.die(include_parent=False)
        return 1
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    if args.config.node_rank >= 1:
        return asyncio.run(twin.serve_dummy_health())
    return asyncio.run(twin.serve())


if __name__ == "__main__":
    raise SystemExit(main())
