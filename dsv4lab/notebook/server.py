"""A launched server as a notebook user meets it: ``url``, ``wait()``, ``bench()``, ``profile()``, ``stop()``.

:class:`Server` wraps a :class:`~dsv4lab.serving.launch.ServerHandle` (the files and processes on the host) with
what a session knows about it: its name, its local results folder, the readiness verdict, the benchmark
runs so far, the GPU samples. Every blocking method gives control back within about a second of Stop and
keeps what it measured (on :class:`~dsv4lab.errors.Interrupted` and in ``runs`` / ``readiness``).

Servers are made by :meth:`dsv4lab.notebook.lab.Lab.launch`; the functions underneath (``launch``, ``wait_ready``,
``bench.sweep``, ``kernels.profile_server``) stay public for scripts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from dsv4lab import bench
from dsv4lab import htmlview as hv
from dsv4lab.atomicfile import write_json_atomic, write_text_atomic
from dsv4lab.config.hardware import HardwareProfile
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.counts import plural
from dsv4lab.errors import BenchError, ConfigError, DSV4LabError, Interrupted, ProfileError
from dsv4lab.hosts import KillReport, PortForward
from dsv4lab.logs import Diagnosis
from dsv4lab.secrets import collect_secrets, redact_text
from dsv4lab.serving.gpumem import read_samples_csv
from dsv4lab.serving.launch import AnyConfig, ServerHandle
from dsv4lab.serving.profiling import KernelBreakdown, profile_server
from dsv4lab.serving.watch import VERDICT_STATE, Readiness, Verdict, wait_ready
from dsv4lab.tables import Table, table
from dsv4lab.units import fmt_tok_s

if TYPE_CHECKING:
    from dsv4lab.serving.gpumem import GpuSampler

__all__ = ["Server", "stop_soon"]

#: The workload a plain ``bench()`` sends when none is given: what a chat-sized request looks like.
DEFAULT_INPUT_LEN = 1024
DEFAULT_OUTPUT_LEN = 128


class Server:
    """One server a :class:`~dsv4lab.notebook.lab.Lab` launched (or re-attached to)."""

    def __init__(
        self,
        handle: ServerHandle,
        name: str,
        local_dir: Path,
        *,
        hardware: HardwareProfile,
        progress: bool = True,
        keep: bool = False,
        sampler: GpuSampler | None = None,
        sampler_error: Exception | None = None,
    ) -> None:
        """``hardware`` is the host's profile (the diagnosis and the preflight use it); ``sampler`` the GPU
        sampler started for this server before it (the server owns it from here and stops it when it ends),
        or ``sampler_error`` why there is none."""
        self.handle = handle
        self.hardware = hardware
        #: Live progress lines for this server's blocking calls (the session's setting at launch).
        self.progress = progress
        self.name = name
        self.local_dir = local_dir
        #: Leave the server running when the session ends (a kernel restart, ``stop_all``)?
        self.keep = keep
        #: The last readiness verdict (None until :meth:`wait` has run).
        self.readiness: Readiness | None = None
        #: Every benchmark run made on this server, in order (partial ones included).
        self.runs: bench.BenchRuns = bench.BenchRuns()
        self.stopped: KillReport | None = None
        self._forward: PortForward | None = None
        self._sampler = sampler
        self._sampler_error = sampler_error
        self._gpu_samples: pd.DataFrame | None = None
        self._sampler_lock = threading.Lock()

    # -- identity ---------------------------------------------------------------------------------------

    @property
    def config(self) -> AnyConfig:
        return self.handle.config

    @property
    def port(self) -> int:
        return self.handle.port

    @property
    def run_dir(self) -> str:
        """The run directory on the server's host (the same as ``local_dir`` on this machine)."""
        return self.handle.run_dir

    @property
    def url(self) -> str:
        """A URL this machine can reach: through the SSH tunnel for a remote host."""
        if self._forward is None:
            self._forward = self.handle.forward()
        return self._forward.url

    @property
    def state(self) -> str:
        """``starting`` until a verdict (``QUEUED (Resources)`` while its Slurm job waits), then the verdict
        (READY, CRASHED, ...); ``stopped`` once a running server was stopped (a crashed one stays CRASHED)."""
        verdict = self.readiness.verdict if self.readiness is not None else None
        if self.stopped is not None and verdict in (None, Verdict.READY, Verdict.INTERRUPTED, Verdict.QUEUED):
            return "stopped"
        if verdict is None or verdict is Verdict.QUEUED:
            with contextlib.suppress(DSV4LabError):
                job = self.handle.waiting()
                if job is not None:
                    return f"QUEUED ({job.reason})"
        if verdict is None or verdict is Verdict.QUEUED:
            return "starting"  # a queued job that started since the last watch: the next one says how it went
        return str(verdict.value)

    @property
    def ready(self) -> bool:
        return self.readiness is not None and self.readiness.ready and self.stopped is None

    # -- lifecycle --------------------------------------------------------------------------------------

    def wait(self, timeout_s: float = 900.0, *, stall_after_s: float = 300.0, keep_running: bool = False) -> Server:
        """Watch the startup until READY, CRASHED, STALLED or TIMEOUT and return the server (chainable).

        A crash is a result, not an error: ``readiness`` holds the verdict with the model-checked diagnosis,
        and the server shows it. Stop stops the server (unless ``keep_running``) and keeps the partial
        readiness.
        """
        try:
            self.readiness = wait_ready(
                self.handle,
                timeout_s,
                stall_after_s=stall_after_s,
                keep_running=keep_running,
                progress=self.progress,
                hardware=self.hardware.name,
            )
        except Interrupted as exc:
            if isinstance(exc.partial, Readiness):
                self.readiness = exc.partial
            self.record()
            if not keep_running:  # the watch stopped the server: its GPU timeline ends here too
                threading.Timer(1.0, self.stop_sampling).start()
            exc.kept_in("{}.readiness", self)
            raise
        self.record()
        if self.readiness.ready:
            self._warm()
        return self

    def stop(self, *, grace_s: float = 10.0) -> KillReport:
        """End the server's whole process tree; its files stay in the run dir (copied locally first)."""
        report = self.handle.stop(grace_s=grace_s)
        self.stopped = report
        if self._forward is not None:
            self._forward.close()
            self._forward = None
        self.stop_sampling()
        self.fetch()
        return report

    def is_alive(self) -> bool:
        return self.handle.is_alive()

    @property
    def gpu_sampler(self) -> GpuSampler | None:
        """The sampler taking this server's GPU memory now (None once stopped, or if it never started)."""
        with self._sampler_lock:
            return self._sampler

    def stop_sampling(self) -> None:
        """Stop sampling this server's GPUs and keep the samples (its memory timeline ends here); idempotent,
        and safe from another thread (a timer stops it a moment after a death)."""
        with self._sampler_lock:
            sampler, self._sampler = self._sampler, None
        if sampler is None:
            return
        with contextlib.suppress(Exception):
            sampler.stop()
        with self._sampler_lock:
            self._gpu_samples = sampler.frame()

    # -- measurements -----------------------------------------------------------------------------------

    def bench(
        self,
        concurrency: Sequence[int] | int | str = (1, 16),
        *,
        prompts: int | None = None,
        input_len: int = DEFAULT_INPUT_LEN,
        output_len: int = DEFAULT_OUTPUT_LEN,
        repeats: int = 1,
        seed: int = 7,
        workload: bench.Workload | None = None,
        warmup: int = 0,
        api: str = "completions",
        label: str | None = None,
    ) -> bench.BenchRuns:
        """Benchmark at each concurrency level with the built-in streaming client; return the runs.

        ``prompts`` per run defaults to one wave, max(2, concurrency): every request starts together and
        the run measures steady decoding at that batch size (what an A/B compares). Stop cuts the in-flight
        requests and keeps the finished and partial runs (in ``runs`` as well).
        """
        self.require_ready("bench")

        def workload_for(level: int) -> bench.Workload:
            if workload is not None:
                return workload
            n = prompts if prompts is not None else max(2, level)
            return bench.random_workload(n, input_len, output_len, seed=seed)

        store = str(self.local_dir / "bench")
        drops = self._connection_drops()
        try:
            runs = bench.sweep(
                self.url,
                workload_for,
                concurrency,
                repeats=repeats,
                load=bench.LoadSpec(warmup=warmup),
                options=bench.ClientOptions(api=api),  # type: ignore[arg-type]
                label=label or self.name,
                progress=self.progress,
                on_server_death=self._death_note,
                server=bench.ServerContext(host=self.handle.host, config=self.config, alive=self.handle.is_alive),
                store=store,
            )
        except Interrupted as exc:
            if isinstance(exc.partial, bench.BenchRuns):
                self.runs = self.runs + exc.partial
                new = len(exc.partial)
                exc.kept_in("{}.runs" if len(self.runs) == new else f"{{}}.runs[-{new}:]", self)
            raise
        self.runs = self.runs + runs
        cut = sum(r.summary.incomplete + r.summary.failed for r in runs)
        if cut and self._connection_drops() > drops:
            warnings.warn(
                f"the SSH connection to {self.handle.host.name} dropped during the benchmark and was re-opened; "
                f"{plural(cut, 'request')} {plural(cut, 'was', number=False)} cut (counted as incomplete or failed, "
                "the rest measured normally). "
                "Rerun for clean numbers.",
                stacklevel=2,
            )
        return runs

    def profile(
        self,
        concurrency: int = 16,
        *,
        prompts: int | None = None,
        input_len: int = DEFAULT_INPUT_LEN,
        output_len: int = DEFAULT_OUTPUT_LEN,
        within: str | None = "decode",
        seed: int = 7,
    ) -> KernelBreakdown:
        """A torch-profiler kernel breakdown of the server under load (decode steps only, by default)."""
        self.require_ready("profile")
        n = prompts if prompts is not None else concurrency
        wl = bench.random_workload(n, input_len, output_len, seed=seed)
        load = bench.LoadSpec(concurrency=concurrency, warmup=0)  # a warm-up request would decode alone

        def during() -> None:
            try:
                result = bench.run(
                    self.url,
                    wl,
                    load,
                    progress=self.progress,
                    label=f"{self.name} profile",
                    on_server_death=self._death_note,
                    store=str(self.local_dir / "bench"),
                )
            except Interrupted as exc:  # Stop: the load run so far is kept here too, not only on the exception
                if isinstance(exc.partial, bench.BenchResult):
                    self.runs = bench.BenchRuns((*self.runs, exc.partial))
                    exc.kept_in("{}.runs[-1]", self)
                raise
            self.runs = bench.BenchRuns((*self.runs, result))  # the load run is a measurement too: kept, partial or not
            if result.partial and not result.interrupted:
                raise ProfileError(self._died_during("profiling", result.abort_reason))

        remote = f"{self.run_dir}/profile"
        try:
            breakdown = profile_server(
                self.url, self.handle.host, remote, during, local_dir=str(self.local_dir / "traces"), within=within
            )
            return dataclasses.replace(breakdown, clock=self.handle.clock)
        except ProfileError as exc:
            if "died during" in str(exc) or self.handle.is_alive():
                raise
            self._death_note()  # the server went away around the profile: say so, not "connection refused"
            raise ProfileError(self._died_during("profiling", str(exc))) from exc

    def _died_during(self, what: str, detail: str | None) -> str:
        r = self.readiness
        verdict = f"{r.verdict.value}: {r.reason}" if r is not None and not r.ready else (detail or "it stopped")
        return (
            f"{self.name} died during {what}: {verdict} The load run is kept in {self.name}.runs and "
            f"{self.local_dir / 'bench'}; the log and readiness.json are in {self.local_dir}"
        )

    def diagnose(self) -> Diagnosis:
        """The model-checked diagnosis of the whole log (the same card ``readiness`` carries on a crash)."""

        log = self.fetch()
        return self.handle.engine.diagnose(str(log), hardware=self.hardware, version=self.handle.version)

    def gpu_memory(self) -> pd.DataFrame:
        """GPU memory samples taken while this server ran: ``time`` (the host's clock, tz-aware), ``t`` (s),
        ``gpu``, ``used_mib``, ``total_mib``, ``util_pct``. Also in ``local_dir / "gpu_memory.csv"``. On the
        twin the frame's ``attrs["time_scale"]`` says ``t`` is on the twin clock (charts convert it)."""
        with self._sampler_lock:
            sampler, kept = self._sampler, self._gpu_samples
        if sampler is not None:
            sampler.wait_first()  # a Slurm job's sampler starts once the job runs: its first sample may be due
            frame: pd.DataFrame = sampler.frame()
        elif kept is not None:
            frame = kept
        else:
            path = self.local_dir / "gpu_memory.csv"
            if not path.exists():
                raise ConfigError("sample_gpus", False, f"launch with sample_gpus=True to sample {self.name}'s GPUs")
            frame = read_samples_csv(path)
        if frame.empty and self._sampler_error is not None:
            raise self._sampler_error
        clock = self.handle.clock
        if clock.is_twin:
            frame.attrs["clock"] = clock.kind
        if self.host_memory_plan is not None:
            frame.attrs["memory_of"] = "host"
        return frame

    @property
    def host_memory_plan(self) -> dict[str, Any] | None:
        """The launch's memory prediction on a host without GPUs (vLLM's CPU build: the host's memory node,
        the weights, vLLM's processes and the KV space asked for), as ``handle.json`` keeps it; None on a GPU
        host, where the samples are nvidia-smi's."""
        plan = self.handle.extra.get("preflight")
        return plan if isinstance(plan, dict) and plan.get("backend") == "cpu" else None

    def memory_timeline(self, *, title: str | None = None) -> Any:
        """The memory chart of this server's startup (and life) (:func:`dsv4lab.plots.memory_timeline`): on a
        GPU host every GPU, with the phases and the OOM from its log and the static line from the preflight;
        on a host without one, the server's processes against the host's memory, with the memory available at
        launch and the launch's prediction (processes + weights + KV space) as lines."""
        from dsv4lab import plots
        from dsv4lab.model.memory import preflight

        cfg = self.config
        p = preflight(cfg, self.hardware, sglang_version=self.handle.version) if isinstance(cfg, ServerConfig) else None
        return plots.memory_timeline(
            self.gpu_memory(),
            log=str(self.fetch()),
            preflight=p,
            config=self.name,
            title=title,
            references=_host_references(self.host_memory_plan),
        )

    def fp8_kernels(self) -> Table:
        """Which FP8 GEMM kernel configs the server loaded: per config file, tuned or not and how many lookups
        (ranks x GEMM shapes) found it.

        The story's first check: a tuned JSON that SGLang did not find costs about 6 % and says so only in
        one log line."""
        from dsv4lab.logs import KernelConfig, parse_log

        found: dict[tuple[str, bool, str], int] = {}
        for e in parse_log(str(self.fetch())):
            if isinstance(e, KernelConfig):
                key = (e.kernel, e.tuned, (e.path or "").rsplit("/", 1)[-1])
                found[key] = found.get(key, 0) + 1
        rows = [{"kernel": k, "tuned": t, "config file": f, "lookups": n} for (k, t, f), n in found.items()]
        return table(
            rows,
            columns=["kernel", "tuned", "config file", "lookups"],
            title=f"FP8 kernel configs {self.name} loaded",
            note="lookups: ranks x GEMM shapes that asked for the config (one log line each)",
        )

    def observed_budget(self) -> Any:
        """The per-GPU memory split as this server's log tells it (:func:`dsv4lab.model.budget.observed_budget`)."""
        from dsv4lab.model.budget import observed_budget

        return observed_budget(str(self.fetch()), hardware=self.hardware)

    def log(self, lines: int = 40) -> LogTail:
        """The last lines of ``server.log``."""
        text = self.handle.host.read_text(self.handle.log_path, max_bytes=max(4096, lines * 400)) or ""
        return LogTail(self.name, redact_text(text, collect_secrets(self.config)).splitlines()[-lines:])

    def fetch(self) -> Path:
        """Copy the run dir's small files (log, config, verdicts) from the host into ``local_dir``; the log path.

        The copies are redacted (:mod:`dsv4lab.secrets`): ``env.sh`` keeps the server's token on the host only.
        """
        local_log = self.local_dir / "server.log"
        if Path(self.run_dir).resolve() == self.local_dir.resolve():
            return local_log
        self.local_dir.mkdir(parents=True, exist_ok=True)
        host = self.handle.host
        known = collect_secrets(self.config)
        for name in ("server.log", "config.toml", "env.sh", "launch.sh", "handle.json", "server.exit", "stopped.json"):
            text = host.read_text(f"{self.run_dir}/{name}", max_bytes=64 << 20)
            if text is not None:
                write_text_atomic(self.local_dir / name, redact_text(text, known))
        return local_log

    # -- internals --------------------------------------------------------------------------------------

    def require_ready(self, what: str) -> None:
        """Refuse ``what`` (a benchmark, a profile) unless the server is READY, saying what it is instead."""
        if self.readiness is None:
            raise BenchError(f"{self.name}: call wait() before {what}() (the server may still be starting)")
        if not self.ready:
            raise BenchError(f"{self.name} is {self.state}, not READY: nothing to {what}")

    def _warm(self) -> None:
        """One short request, so measured runs start on a warm server (first requests compile kernels)."""
        wl = bench.random_workload(1, 64, 4, seed=1)
        with contextlib.suppress(BenchError):  # a server that cannot answer shows in the first real run
            bench.run(self.url, wl, bench.LoadSpec(warmup=0), progress=False)

    def _death_note(self) -> object:
        """What the log says when a benchmark sees the server die (attached to the partial result)."""
        r = wait_ready(self.handle, 5.0, progress=False, keep_running=True, hardware=self.hardware.name)
        self.readiness = r
        self.record()
        return r.reason

    def record(self) -> None:
        """Save the readiness verdict (``readiness.json``) and, for a server that is gone, its log copies."""
        if self.readiness is None:
            return
        if self.readiness.verdict not in (Verdict.READY, Verdict.INTERRUPTED):
            # The server is gone: keep a moment of samples after the death (the memory coming back), then
            # stop, so the timeline ends where the story does.
            threading.Timer(1.0, self.stop_sampling).start()
        try:
            write_json_atomic(self.local_dir / "readiness.json", self.readiness.to_dict())
        except OSError as exc:  # a full disk must not turn a verdict into an exception: say what was not kept
            warnings.warn(
                f"{self.name}: could not save readiness.json in {self.local_dir} ({exc}); the verdict "
                f"({self.readiness.verdict.value}) is only in {self.name}.readiness",
                stacklevel=3,
            )
        if self.readiness.verdict is not Verdict.READY:
            try:
                self.fetch()
            except OSError as exc:
                warnings.warn(f"{self.name}: could not copy the server's log home ({exc})", stacklevel=3)

    def _connection_drops(self) -> int:
        """How often the connection to the server's host was re-opened so far (0 for this machine)."""
        return int(getattr(self.handle.host, "reconnects", 0))

    # -- display ----------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "url": self._forward.url if self._forward is not None else None,
            "port": self.port,
            "run_dir": self.run_dir,
            "local_dir": str(self.local_dir),
            "runs": len(self.runs),
            **{
                k: v
                for k, v in self.handle.to_dict().items()
                if k in ("host", "target", "sglang_version", "launcher_pid")
            },
        }

    def __repr__(self) -> str:
        return f"Server({self.name!r}, {self.state}, port {self.port} on {self.handle.host.name})"

    def _repr_html_(self) -> str:
        state: hv.State = "info" if self.stopped is not None else "running"
        if self.readiness is not None and self.stopped is None:
            state = VERDICT_STATE[self.readiness.verdict]
        facts: list[tuple[str, object]] = [
            ("host", f"{self.handle.host.name} ({self.handle.target}, SGLang {self.handle.sglang_version} flags)"),
            ("port", str(self.port)),
            ("run dir", self.run_dir),
        ]
        done = [r for r in self.runs if r.summary.completed]
        if done:
            best = max(done, key=lambda r: r.on_hardware.output_throughput)
            facts.append(
                (
                    "benchmark runs",
                    f"{plural(len(self.runs), 'run')}; best {fmt_tok_s(best.on_hardware.output_throughput)} output "
                    f"at concurrency {best.concurrency}{best.clock.tag}",
                )
            )
        elif self.runs:
            facts.append(("benchmark runs", f"{plural(len(self.runs), 'run')}; none completed a request"))
        body = hv.kv_table(facts)
        if self.readiness is not None:
            body += self.readiness._repr_html_()
        return hv.card(f"server {self.name}", body, state=state, status=self.state)


class LogTail:
    """The last lines of a server log, shown folded."""

    def __init__(self, name: str, lines: list[str]) -> None:
        self.name = name
        self.lines = lines

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        return hv.card(
            f"{self.name}: server.log (last {plural(len(self.lines), 'line')})", hv.fold(self.lines, keep=20)
        )


def _host_references(plan: dict[str, Any] | None) -> list[tuple[float, str]]:
    """The lines a host-memory chart draws from the launch's prediction: what was available at launch, and
    what the server was predicted to take (its processes, the weights and the KV space it asked for)."""
    if plan is None or not plan.get("split"):
        return []
    split = plan["split"][0]
    available = float(split.get("free_gib") or 0.0)
    predicted = sum(float(split.get(k) or 0.0) for k in ("non_torch_gib", "weights_gib", "kv_cache_gib"))
    kv = float(split.get("kv_cache_gib") or 0.0)
    return [
        (available, f"available at launch {available:.1f} GiB"),
        (predicted, f"predicted {predicted:.1f} GiB: processes + weights + KV space {kv:.1f} GiB"),
    ]


def stop_soon(servers: Sequence[Server], *, after_s: float = 0.5) -> None:
    """Stop ``servers`` side by side in threads that start ``after_s`` later, once the cell has given
    control back: the user's Stop must return within about a second, and stopping two servers beside the
    kernel's reply (killing, copying and redacting their logs) delayed that reply past 2 s on a loaded
    machine (0.6 s with the stop deferred). The threads are not daemons: a script still waits for them."""

    def stop(server: Server) -> None:
        with contextlib.suppress(Exception):
            server.stop(grace_s=10.0)

    for server in servers:
        threading.Timer(after_s, stop, args=(server,)).start()
