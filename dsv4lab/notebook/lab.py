"""The notebook session: one object that knows the host, the target, the hardware and the servers it started.

A campaign step should read like the step it performs::

    lab = Lab(host="local", target="twin", hardware="rtx-pro-6000-x8")  # virtual time; pace=0.05 to pace it
    lab.preflight("config_b")              # the budget card: OOM in graph capture, GPU 1, short ~20 GiB
    b = lab.launch("config_b").wait()      # CRASHED card with the model-checked diagnosis
    a = lab.launch("config_a").wait()      # free port, run dir, twin settings: all picked here
    a.bench(concurrency=[1, 16])           # a table; .to_frame() for pandas

The session picks and reserves a free port for every launch, builds the twin's settings, maps the presets'
tuned-kernel folder to the right place for the target, and tracks every server it started: ``stop_all()``,
the ``with`` block, and interpreter exit (a finished papermill run, a restarted kernel) stop them unless
they were launched with ``keep=True``. The functions underneath stay public for scripts.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as _dt
import math
import os
import re
import time
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, overload

from dsv4lab import bench
from dsv4lab import htmlview as hv
from dsv4lab.atomicfile import write_json_atomic
from dsv4lab.bench.workload import check_load
from dsv4lab.config import AnyConfig, VllmConfig
from dsv4lab.config.hardware import HardwareProfile, ModelProfile, hardware_profile, model_profile
from dsv4lab.config.presets import KERNEL_CONFIG_DIR, PRESETS, preset
from dsv4lab.config.server_config import ServerConfig, diff
from dsv4lab.counts import plural
from dsv4lab.engines import ENGINE_NAMES, Engine, SessionSettings, SGLangEngine, get_engine
from dsv4lab.engines.base import check_pace
from dsv4lab.errors import ConfigError, Interrupted, LaunchError, StaleServerError
from dsv4lab.hosts import Host, LocalHost, open_host
from dsv4lab.logs import Diagnosis
from dsv4lab.model.memory import Preflight, Suggestion, suggest
from dsv4lab.model.vllm_memory import VllmPreflight
from dsv4lab.notebook.server import DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN, Server, stop_soon
from dsv4lab.notebook.tune import run_tune
from dsv4lab.serving.hostmem import HostProbe
from dsv4lab.serving.launch import ServerHandle, attach, launch, pick_port
from dsv4lab.serving.slurm import SlurmPlacement
from dsv4lab.serving.watch import Readiness, Verdict
from dsv4lab.tables import Table, table
from dsv4lab.units import Clock

__all__ = ["TARGETS", "Lab"]

#: The values ``target=`` accepts: the engines (the twin, SGLang itself).
TARGETS: tuple[str, ...] = ENGINE_NAMES

#: The hardware profile of a session that names none: the story's host.
DEFAULT_HARDWARE = "rtx-pro-6000-x8"
#: The first port a launch tries, unless the Lab is given one or ``$DSV4LAB_BASE_PORT`` names one.
DEFAULT_BASE_PORT = 31000
BASE_PORT_ENV = "DSV4LAB_BASE_PORT"
#: Ports tried before a launch gives up (each taken one is skipped).
_PORT_ATTEMPTS = 20
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class Lab:
    """A session against one host (this machine, or an SSH alias) and one target (the twin, or SGLang)."""

    def __init__(
        self,
        host: str | Host = "local",
        *,
        target: str = "twin",
        hardware: str | None = None,
        sglang_version: str | None = None,
        version: str | None = None,
        pace: float | None = None,
        time_scale: float | None = None,
        python: str | None = None,
        run_root: str | Path = "runs",
        remote_root: str = "~/dsv4lab-runs",
        kernel_config_dir: str | None = None,
        base_port: int | None = None,
        keep_servers: bool = False,
        seed: int | None = None,
        progress: bool = True,
        known_hosts: str = "~/.ssh/known_hosts",
        trust_host_key: bool = False,
        slurm: SlurmPlacement | Mapping[str, Any] | None = None,
    ) -> None:
        """
        Args:
            host: ``"local"``, an SSH alias from ``~/.ssh/config``, ``user@host:port``, or a Host.
            target: ``"twin"`` (the SGLang twin, no GPU needed) or ``"sglang"`` (real SGLang).
            hardware: hardware profile of the host (the twin emulates it; preflight and diagnosis use it);
                unset: ``rtx-pro-6000-x8`` (the story's), which a vLLM session on a host without GPUs never
                reads (its preflight reads the host's own memory).
            sglang_version: SGLang release whose flags to render (default: the newest dsv4lab knows).
            version: the engine's release whose flags to render, for any engine (vLLM's: ``"0.32.0"``);
                for SGLang and the twin the same as ``sglang_version``.
            pace: twin only: None (the default) serves in virtual time, as fast as this machine computes,
                with the same figures on any machine; a number paces the twin at that many wall seconds per
                modelled second (1 = real time), for what needs real time on the wire (watching a crash as
                it happens, the memory sampler over a startup). ``launch(pace=...)`` sets it per server.
            time_scale: the old name of ``pace`` (deprecated).
            python: the server host's interpreter (a venv or conda env) for SGLang, the twin, bench_serving.
            run_root: local folder for results; each server gets ``run_root/<name>``.
            remote_root: on an SSH host, where run directories go (``<remote_root>/<session>/<name>``).
            kernel_config_dir: tuned FP8 kernel-config folder on the host for configs that use the presets'
                default; on the twin, unset means the twin's stand-in autotune output, written here.
            base_port: the first port tried for each launch (default: ``$DSV4LAB_BASE_PORT``, else 31000; two
                people or two test workers on one machine each set their own).
            keep_servers: leave servers running when the session ends.
            seed: twin seed (drift and timing noise); unset = the twin's default.
            progress: live progress in notebooks, text lines in scripts and papermill.
            known_hosts, trust_host_key: SSH host-key checking (an unknown key is refused unless trusted).
            slurm: run every server as a Slurm batch job (a :class:`~dsv4lab.serving.slurm.SlurmPlacement`, or
                its fields as a dict: ``{"partition": "gpu", "gpus_per_node": 8, "time_min": 30}``); ``host``
                is then the cluster's login host.
        """
        engine = get_engine(target)
        if time_scale is not None:
            warnings.warn(
                "Lab(time_scale=...) is now Lab(pace=...); time_scale goes in the next release",
                FutureWarning,
                stacklevel=2,
            )
            pace = time_scale if pace is None else pace
        pace = check_pace("pace", pace)
        if base_port is None:
            from_env = os.environ.get(BASE_PORT_ENV, "")
            base_port = int(from_env) if from_env.isdigit() else DEFAULT_BASE_PORT
        if not (isinstance(base_port, int) and 1024 <= base_port <= 65000):
            raise ConfigError("base_port", base_port, "an integer from 1024 to 65000")
        self.engine: Engine = engine
        self.target: str = engine.name
        self.hardware: HardwareProfile = hardware_profile(hardware or DEFAULT_HARDWARE)
        #: Whether the hardware profile was named (an unnamed one is only the default, never a claim).
        self.hardware_named = hardware is not None
        if version is not None and sglang_version is not None and version != sglang_version:
            raise ConfigError("version", version, f"one release: version= or sglang_version= ({sglang_version})")
        #: The engine release whose flags this session renders.
        self.version = engine.resolve_version(version if version is not None else sglang_version)
        #: The twin's pace (None: virtual time).
        self.pace = pace if engine.rehearsal else None
        self.python = python
        self.kernel_config_dir = kernel_config_dir
        self.base_port = base_port
        self.keep_servers = keep_servers
        self.seed = seed
        self._progress = progress
        self.run_root = Path(run_root).expanduser().resolve()
        self.session = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        self.host: Host = open_host(host, known_hosts=known_hosts, trust_unknown_host=trust_host_key)
        #: How to reach the host again (a report, a runner stopping orphans): "local" or the SSH alias.
        self.host_spec = "local" if isinstance(self.host, LocalHost) else self.host.name
        self.remote_root = remote_root
        self.servers: list[Server] = []
        self._twin_kernel_dir: str | None = None
        #: Where servers run: on the host itself (None) or as Slurm jobs submitted through it.
        self.slurm: SlurmPlacement | None = _placement(slurm)
        _LIVE.add(self)

    # -- configs ----------------------------------------------------------------------------------------

    @property
    def progress(self) -> bool:
        """Live progress lines for blocking calls (a panel that draws its own turns them off); every server
        of the session follows the setting."""
        return self._progress

    @progress.setter
    def progress(self, value: bool) -> None:
        self._progress = bool(value)
        for server in self.servers:
            server.progress = self._progress

    @property
    def sglang_version(self) -> str:
        """The SGLang release whose flags the session renders (``version``; SGLang's engines only)."""
        if not isinstance(self.engine, SGLangEngine):
            raise ConfigError(
                "sglang_version",
                self.target,
                f"an SGLang or twin session; this one renders {self.engine.release_words(self.version)}",
            )
        return self.version

    @property
    def is_local(self) -> bool:
        return isinstance(self.host, LocalHost)

    @property
    def clock(self) -> Clock:
        """The clock this session's figures are read on: the modelled hardware on the twin."""
        return self.engine.clock(self._settings())

    def _settings(self, fault: str | None = None, pace: float | None = None) -> dict[str, str] | None:
        """The engine settings every launch of this session exports (the twin's profile, pace, seed)."""
        session = SessionSettings(self.hardware.name, self.pace if pace is None else pace, fault, self.seed)
        return self.engine.launch_env(session)

    @property
    def model(self) -> ModelProfile:
        return model_profile(preset("config_a").model_path)

    @overload
    def config(self, config: VllmConfig, **overrides: Any) -> VllmConfig: ...
    @overload
    def config(self, config: ServerConfig | str = "config_a", **overrides: Any) -> ServerConfig: ...
    def config(self, config: AnyConfig | str = "config_a", **overrides: Any) -> AnyConfig:
        """A preset name (``config_a``, ``config_b``, ``config_b_fixed``), a ``.toml``/``.json`` path or a
        config, with field overrides (``mem_fraction_static=0.6``, ``speculative__num_steps=2``,
        ``env__NCCL_PROTO="LL"``; text values are parsed as the field's type).

        The presets' tuned-kernel folder is mapped to this session's: the twin's stand-in autotune
        output, or ``kernel_config_dir`` when given.
        """
        # Every value is checked before anything is written; a vLLM lab takes a VllmConfig or a file of one.
        cfg: AnyConfig = self.engine.resolve_config(config, overrides)
        if not isinstance(cfg, ServerConfig):
            return cfg
        if cfg.kernel_config_dir == KERNEL_CONFIG_DIR and "kernel_config_dir" not in overrides:
            cfg = cfg.replace(kernel_config_dir=self._kernel_dir())
        return cfg

    def _kernel_dir(self) -> str:
        if self.kernel_config_dir is not None:
            return self.kernel_config_dir
        if not self.engine.rehearsal:
            return KERNEL_CONFIG_DIR
        if self._twin_kernel_dir is None:
            self._twin_kernel_dir = self._write_twin_kernel_configs()
        return self._twin_kernel_dir

    def _write_twin_kernel_configs(self) -> str:
        """The twin's stand-in for the story's FP8 autotune run, on the host the twin runs on."""
        from dsv4lab.twin.kernels import expected_config_names, write_tuned_configs

        if self.is_local:
            return str(write_tuned_configs(self.run_root / "kernel-configs", self.hardware, self.model))
        remote = self.host.absolute_path(f"{self.remote_root}/kernel-configs")
        self.host.makedirs(remote)
        for name in expected_config_names(self.hardware, self.model):
            self.host.put_text(f"{remote}/{name}", '{"1": {"BLOCK_SIZE_M": 16}}\n')
        return remote

    @overload
    def preflight(self, config: VllmConfig, **overrides: Any) -> VllmPreflight: ...
    @overload
    def preflight(self, config: ServerConfig | str = "config_a", **overrides: Any) -> Preflight: ...
    def preflight(self, config: AnyConfig | str = "config_a", **overrides: Any) -> Preflight | VllmPreflight:
        """Predict whether the config fits, where it would fail and by how much: SGLang's split of every GPU
        of the hardware profile; vLLM's on the host's own memory when it has no GPU (its CPU build)."""
        cfg = self.config(config, **overrides)
        prediction: Preflight | VllmPreflight = self.engine.preflight(
            cfg, self.version, hardware=self.hardware, facts=HostProbe(self.host)
        )
        return prediction

    def suggest(
        self, config: ServerConfig | str = "config_a", *, concurrency: int | None = None, **overrides: Any
    ) -> list[Suggestion]:
        """Changes the memory model predicts would fit, each with its margin (best first)."""
        cfg = self._sglang_config(config, overrides)
        return suggest(cfg, self.hardware, sglang_version=self.sglang_version, concurrency=concurrency)

    def _sglang_config(self, config: ServerConfig | str, overrides: Mapping[str, Any]) -> ServerConfig:
        """A config the SGLang memory model reads (a vLLM config is refused, naming the engine)."""
        cfg = self.config(config, **overrides)
        if not isinstance(cfg, ServerConfig):
            raise ConfigError(
                "config", cfg.name, f"an SGLang config: the {self.target} engine's memory model reads only SGLang's"
            )
        return cfg

    # -- servers ----------------------------------------------------------------------------------------

    def launch(
        self,
        config: AnyConfig | str = "config_a",
        *,
        name: str | None = None,
        wait: bool = False,
        port: int | None = None,
        keep: bool | None = None,
        fault: str | None = None,
        sample_gpus: bool = True,
        preflight: bool = True,
        pace: float | None = None,
        **overrides: Any,
    ) -> Server:
        """Start a server and return it at once (``wait=True`` also watches it to a verdict).

        Picks and reserves a free port (or uses ``port``), makes the run dir, checks the host's Python and
        the kernel-config folder, and starts the twin or SGLang. ``fault`` injects a twin fault
        (``silent_death``, ``capture_hang``, ``nccl_error``, ``port_in_use``, ``crash_serving[:s]``,
        ``slow_start[:x]``). The server is tracked: the session stops it at its end unless ``keep``.

        A launch the engine's memory preflight predicts to fail on this host (vLLM's CPU build) is refused
        before anything starts; ``preflight=False`` launches it anyway, to watch it fail. ``pace`` paces
        this twin (see :class:`Lab`) where the session's is virtual.
        """
        pace = check_pace("pace", pace)
        if pace is not None and not self.engine.rehearsal:
            raise ConfigError("pace", pace, "only on the twin (target='twin')")
        if not isinstance(preflight, bool):
            raise ConfigError("preflight", preflight, "True (refuse a launch predicted not to fit) or False")
        cfg = self.config(config, **overrides)
        if fault is not None and not self.engine.rehearsal:
            raise ConfigError("fault", fault, "only on the twin (target='twin')")
        base = name or (config if isinstance(config, str) and config in PRESETS else "server")
        label = self._unique_name(base.replace("_", "-"))
        local_dir = self.run_root / label
        local_dir.mkdir(parents=True, exist_ok=True)
        run_dir = str(local_dir) if self.is_local else f"{self.remote_root}/{self.session}/{label}"
        try:
            # launch() itself ends whatever it started when it fails or is stopped half-way.
            handle, sampler, sampler_error = self._start(
                cfg, run_dir, port, fault, local_dir if sample_gpus else None, preflight=preflight, pace=pace
            )
        except KeyboardInterrupt:
            note = _interrupted("the user stopped the launch before the server started; nothing is running")
            _save_verdict(local_dir, note)
            raise Interrupted(
                f"launch of {label}", note, after="before the server started", note="nothing was left running"
            ) from None
        except BaseException:
            # Nothing started: no results folder holding only the idle GPU samples taken before the launch.
            with contextlib.suppress(OSError):
                (local_dir / "gpu_memory.csv").unlink()
            with contextlib.suppress(OSError):
                local_dir.rmdir()  # only if empty: what the launch wrote there (config, script) is evidence
            raise
        server = Server(
            handle,
            label,
            local_dir,
            hardware=self.hardware,
            progress=self.progress,
            keep=self.keep_servers if keep is None else keep,
            sampler=sampler,
            sampler_error=sampler_error,
        )
        self.servers.append(server)
        try:
            # A record beside the results, so that a runner can find (and stop) the server if this kernel dies.
            record = {**handle.to_dict(), "host_spec": self.host_spec, "keep": server.keep, "name": label}
            try:
                write_json_atomic(local_dir / "server.json", record)
            except OSError as exc:
                warnings.warn(
                    f"could not save server.json in {local_dir} ({exc}): if this kernel dies, nothing will stop "
                    f"{label} (launcher PID {handle.launcher_pid} on {self.host.name})",
                    stacklevel=2,
                )
        except KeyboardInterrupt:
            server.readiness = _interrupted("the user stopped the launch; the server was stopped")
            if not server.keep:
                with contextlib.suppress(Exception):
                    server.stop(grace_s=5.0)
            server.record()
            raise Interrupted(
                f"launch of {label}",
                server.readiness,
                after="as the server started",
                note="the server was kept running" if server.keep else "the server was stopped",
            ) from None
        if wait:
            server.wait()
        return server

    def _start(
        self,
        cfg: AnyConfig,
        run_dir: str,
        port: int | None,
        fault: str | None,
        samples_dir: Path | None,
        *,
        preflight: bool = True,
        pace: float | None = None,
    ) -> tuple[ServerHandle, Any, Exception | None]:
        """Pick a port, start GPU sampling for it, launch; retry on the next port if another launch won it.

        Sampling starts *before* the server so the timeline holds the whole startup from idle GPUs on.
        """
        twin_env = self._settings(fault, pace)
        python = self.python
        if python is None and self.engine.rehearsal and self.is_local:
            python = self.engine.default_python(True)
        skipped: list[int] = [s.port for s in self.servers if s.stopped is None]
        for _ in range(_PORT_ATTEMPTS):
            chosen = port if port is not None else pick_port(self.host, self.base_port, avoid=skipped)
            sampler, error = None, None
            if samples_dir is not None and self.slurm is None:
                sampler, error = self._sampler(chosen, twin_env, python, samples_dir, run_dir)
            try:
                handle = launch(
                    self.host,
                    cfg.replace(port=chosen),
                    run_dir,
                    target=self.target,
                    sglang_version=self.version,
                    python=python,
                    twin_env=twin_env,
                    preflight=preflight,
                    placement=self.slurm,
                )
            except BaseException as exc:
                if sampler is not None:
                    sampler.stop()
                if not isinstance(exc, StaleServerError) or port is not None:
                    raise
                skipped.append(chosen)
                continue
            if self.slurm is not None and samples_dir is not None:
                # The job's GPUs are on its node: sampled there, from the moment it runs (srun --overlap).
                running_in = handle.job()
                job = (running_in.job_id if running_in else "", self.slurm.slurm_conf)
                sampler, error = self._sampler(chosen, twin_env, python, samples_dir, run_dir, job=job)
            return handle, sampler, error
        raise StaleServerError(self.host.name, skipped[-1], holder=f"other servers: ports {skipped} are all taken")

    def _sampler(
        self,
        port: int,
        twin_env: dict[str, str] | None,
        python: str | None,
        samples_dir: Path,
        run_dir: str,
        *,
        job: tuple[str, str | None] | None = None,
    ) -> tuple[Any, Exception | None]:
        """A started GPU sampler for the server about to run on ``port`` (the twin's stand-in picks it by
        port), or the reason it could not start — shown by ``gpu_memory()`` and as a warning now."""
        from dsv4lab.serving.gpumem import GpuSampler, smi_command_for

        command = smi_command_for(
            self.engine, python=python or "python3", port=port, twin_env=twin_env, run_dir=run_dir
        )
        if job is not None:
            command = command.in_slurm_job(*job)
        interval = self.engine.sample_interval_ms(twin_env)
        sampler = GpuSampler(
            self.host, interval_ms=interval, csv_path=samples_dir / "gpu_memory.csv", smi_command=command
        )
        try:
            sampler.start(wait_first=job is None)
        except Exception as exc:  # the server can run without it; its memory chart cannot
            warnings.warn(f"GPU memory sampling on {self.host.name} could not start: {exc}", stacklevel=3)
            return None, exc
        return sampler, None

    def _unique_name(self, base: str) -> str:
        if not _NAME.match(base):
            raise ConfigError("name", base, "letters, digits, '.', '_' or '-', starting with a letter or digit")
        taken = {s.name for s in self.servers}
        name, i = base, 2
        while name in taken or (self.run_root / name / "handle.json").exists():
            name, i = f"{base}-{i}", i + 1
        return name

    def attach(self, run_dir: str | Path, *, name: str | None = None, check: bool = True) -> Server:
        """The server of an earlier launch (a restarted kernel, another notebook), with its state *now*.

        ``check`` watches it briefly: a live server reports READY (or its startup goes on), a dead one
        CRASHED or STOPPED — never READY from old log lines.
        """
        handle = attach(self.host, str(run_dir))
        label = name or Path(handle.run_dir).name
        local = Path(run_dir) if self.is_local else self.run_root / label
        server = Server(handle, label, local.resolve(), hardware=self.hardware, progress=self.progress, keep=True)
        self.servers.append(server)
        if check:
            with contextlib.suppress(Exception):
                server.wait(timeout_s=10.0, keep_running=True)
        return server

    def diagnose(self, log: str | Path | Server) -> Diagnosis:
        """The model-checked diagnosis of a server's log (a Server, a run dir, or a log file)."""

        if isinstance(log, Server):
            return log.diagnose()
        path = Path(log)
        if path.is_dir():
            path = path / "server.log"
        return self.engine.diagnose(str(path), hardware=self.hardware, version=self.version)

    def ab(
        self,
        a: Server,
        b: Server,
        concurrency: Sequence[int] | int | str = (1, 16),
        *,
        repeats: int = 3,
        prompts: int | None = None,
        input_len: int = DEFAULT_INPUT_LEN,
        output_len: int = DEFAULT_OUTPUT_LEN,
        seed: int = 7,
        interleave: bool = True,
        labels: tuple[str, str] | None = None,
    ) -> bench.ABRuns:
        """A/B of two running servers: the same workload, interleaved repeats, Welch CIs (``.compare()``).

        ``labels`` name the arms in tables and charts (default: the servers' names). Every argument is
        checked before the first request: two different servers, two different labels, the load."""
        for arm, server in (("a", a), ("b", b)):
            if not isinstance(server, Server):
                raise ConfigError(arm, server, "a server from lab.launch(...) (lab.launch_ab takes configs)")
        if a is b or (a.run_dir == b.run_dir and a.handle.host.name == b.handle.host.name):
            raise ConfigError(
                "b", b.name, f"a server other than a ({a.name}): one server against itself measures nothing"
            )
        shown = _arm_names("labels", labels) if labels is not None else (a.name, b.name)
        if shown[0] == shown[1]:
            raise ConfigError("labels", shown, "two different names for the arms (labels=('A', 'B'))")
        check_load(concurrency, repeats, prompts, input_len, output_len, seed)
        if not isinstance(interleave, bool):
            raise ConfigError("interleave", interleave, "True (A, B, A, B) or False (all of A, then all of B)")
        for s in (a, b):
            s.require_ready("benchmark")

        def workload(level: int) -> bench.Workload:
            n = prompts if prompts is not None else max(2, level)
            return bench.random_workload(n, input_len, output_len, seed=seed)

        store = str(self.run_root / f"ab-{a.name}-vs-{b.name}")
        try:
            runs = bench.run_ab(
                a.url,
                b.url,
                workload,
                concurrency,
                repeats=repeats,
                interleave=interleave,
                load=bench.LoadSpec(warmup=0),
                label_a=shown[0],
                label_b=shown[1],
                progress=self.progress,
                store=store,
            )
        except KeyboardInterrupt as exc:
            partial = getattr(exc, "partial", None)
            if isinstance(partial, bench.ABRuns):
                a.runs, b.runs = a.runs + partial.a, b.runs + partial.b
            if isinstance(exc, Interrupted):
                exc.kept_in("{}.runs, {}.runs", a, b)
            raise
        a.runs, b.runs = a.runs + runs.a, b.runs + runs.b
        return runs

    def launch_ab(
        self,
        a: AnyConfig | str,
        b: AnyConfig | str | None = None,
        concurrency: Sequence[int] | int | str = (1, 16),
        *,
        names: Sequence[str] | None = None,
        a_overrides: Mapping[str, Any] | None = None,
        b_overrides: Mapping[str, Any] | None = None,
        repeats: int = 3,
        prompts: int | None = None,
        input_len: int = DEFAULT_INPUT_LEN,
        output_len: int = DEFAULT_OUTPUT_LEN,
        seed: int = 7,
        together: bool | None = None,
        timeout_s: float = 900.0,
        **changes: Any,
    ) -> bench.ABRuns:
        """Launch two configs and A/B them: each server is started for the comparison and stopped after.

        (``lab.ab`` compares two servers that are already up; ``ABRuns.compare()`` and
        :func:`dsv4lab.bench.compare` compute the statistics.)

        The arms read as the question: ``launch_ab("config_a", "config_b_fixed")`` two configs;
        ``launch_ab("config_a", cuda_graph_max_bs=8)`` (or ``launch_ab("config_a", "config_a",
        cuda_graph_max_bs=8)``) A against A with that change — keyword field overrides change B, the arm
        under test; ``b_overrides``/``a_overrides`` take them as a mapping (``{"speculative.num_steps": 2}``).
        ``names`` label the arms; by default the presets' names, B's with its changes
        (``config_a`` vs ``config_a+cuda_graph_max_bs=8``).

        Everything is checked before the first server starts: both configs and their overrides, the names
        (two different ones), that B differs from A at all, the levels, repeats and lengths.

        ``together`` runs both servers at once and interleaves A, B, A, B (drift spreads over both arms);
        that needs a host that holds both, which the twin does and a GPU host serving one TP-8 model does
        not. By default the twin runs them together and a real host one after the other (A's repeats,
        then B's). A config that does not start raises :class:`~dsv4lab.errors.LaunchError` with its verdict.
        """
        _check_change_names(changes, self.engine.field_names())
        dotted = {key.replace("__", "."): key for key in changes}
        if isinstance(b_overrides, Mapping) and {str(k).replace("__", ".") for k in b_overrides} & set(dotted):
            twice = dotted[sorted({str(k).replace("__", ".") for k in b_overrides} & set(dotted))[0]]
            raise ConfigError(twice, changes[twice], "one value for B: in b_overrides or as a keyword, not both")
        cfg_a, cfg_b, arms = _compare_plan(self.engine, a, b, names, a_overrides, b_overrides, changes)
        check_load(concurrency, repeats, prompts, input_len, output_len, seed)
        if together is not None and not isinstance(together, bool):
            raise ConfigError("together", together, "True (both servers at once), False (one after the other) or None")
        if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
            raise ConfigError("timeout_s", timeout_s, "a positive number of seconds to wait for each server's READY")
        server_names = _server_names(arms)

        together = self.engine.rehearsal if together is None else together
        started: list[Server] = []

        def start(config: AnyConfig, name: str) -> Server:
            # No GPU sampling: an A/B's servers are measured, not charted (a sampler costs a process each).
            server = self.launch(config, name=name, sample_gpus=False)
            started.append(server)
            return server

        def ready(server: Server) -> Server:
            server.wait(timeout_s)
            if not server.ready:
                reason = server.readiness.reason if server.readiness is not None else "no verdict"
                raise LaunchError(f"{server.name} did not start for the comparison: {server.state}: {reason}")
            return server

        kw: dict[str, Any] = {"prompts": prompts, "input_len": input_len, "output_len": output_len, "seed": seed}
        interrupted = False
        runs: list[bench.BenchRuns] = []
        begun = time.monotonic()
        try:
            if together:  # both start at once: their startups overlap
                sa, sb = start(cfg_a, server_names[0]), start(cfg_b, server_names[1])
                return self.ab(ready(sa), ready(sb), concurrency, repeats=repeats, labels=arms, **kw)
            for config, name, label in ((cfg_a, server_names[0], arms[0]), (cfg_b, server_names[1], arms[1])):
                server = ready(start(config, name))
                runs.append(server.bench(concurrency, repeats=repeats, label=label, **kw))
                server.stop(grace_s=10.0)
            return bench.ABRuns(tuple(runs[0]), tuple(runs[1]), arms[0], arms[1])
        except KeyboardInterrupt as exc:
            interrupted = True
            raise _compare_stopped(exc, arms, runs, begun) from None
        finally:
            pending = [server for server in started if server.stopped is None]
            if interrupted:  # Stop: both servers end at once, in threads a script still waits for
                stop_soon(pending)
            else:
                for server in pending:
                    with contextlib.suppress(Exception):
                        server.stop(grace_s=10.0)

    #: ``lab.tune(base, space, objective=, concurrency=, slo=, floor=, budget=, ...)``: the search of
    #: :func:`dsv4lab.notebook.tune.run_tune` with this lab as its first argument (one signature for both).
    tune = run_tune

    def ps(self) -> Table:
        """The servers of this session and whether each is alive now (a table that shows itself; the
        columns of :meth:`Server.to_dict` plus ``alive``)."""
        rows = []
        for s in self.servers:
            alive = s.is_alive()
            row = {**s.to_dict(), "alive": alive}
            now = s.handle.job()
            if now is not None:
                row["slurm job"] = f"{now.job_id} {now.state}" + (f" ({now.reason})" if now.pending else "")
            rows.append(row)
        out = table(rows, title=f"{plural(len(self.servers), 'server')} of this session on {self.host.name}")
        out.note = (
            "state: the watcher's verdict (READY, CRASHED, ...), 'starting' before one, 'stopped' once the lab "
            "stopped it; alive: whether its launcher still runs now"
        )
        return out

    def stop_all(self, *, include_kept: bool = False) -> None:
        """Stop every server this session started that is still running (kept ones only if asked)."""
        for s in list(self.servers):
            if s.stopped is None and (include_kept or not s.keep):
                with contextlib.suppress(Exception):
                    s.stop(grace_s=5.0)
        for s in list(self.servers):  # a server that died or was stopped elsewhere may still be sampled
            s.stop_sampling()

    def close(self) -> None:
        """End the session: stop its servers (unless kept) and close the host connection."""
        self.stop_all()
        with contextlib.suppress(Exception):
            self.host.close()
        _LIVE.discard(self)

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- display ----------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        where = f"{self.host.name!r}, target={self.target!r}, hardware={self.hardware.name!r}"
        return f"Lab({where}, {plural(len(self.servers), 'server')})"

    def _hardware_words(self) -> str:
        profile = f"{self.hardware.name}: {self.hardware.count} x {self.hardware.gpu.name}"
        if self.hardware_named or isinstance(self.engine, SGLangEngine):
            return profile
        return f"none named: the host's own (a host without GPUs is read for its memory; {profile} for GPU estimates)"

    def _repr_html_(self) -> str:
        facts: list[tuple[str, object]] = [
            ("host", self.host.name + (" (Slurm login host)" if self.slurm is not None else "")),
            *([("Slurm", self.slurm.words())] if self.slurm is not None else []),
            ("target", self.target + (f" ({self.clock.how})" if self.engine.rehearsal else "")),
            ("hardware", self._hardware_words()),
            ("flags", self.engine.release_words(self.version)),
            ("results", str(self.run_root)),
        ]
        rows = [{"name": s.name, "state": s.state, "port": s.port, "run dir": s.run_dir} for s in self.servers]
        return hv.card("dsv4lab session", hv.kv_table(facts) + (hv.table(rows) if rows else ""))


#: Longest arm name a comparison accepts (it labels tables and charts, and names the server's folder).
_MAX_ARM_NAME = 100


def _placement(slurm: SlurmPlacement | Mapping[str, Any] | None) -> SlurmPlacement | None:
    if slurm is None or isinstance(slurm, SlurmPlacement):
        return slurm
    if isinstance(slurm, Mapping):
        return SlurmPlacement.from_dict(slurm)
    raise ConfigError("slurm", slurm, "a SlurmPlacement, a dict of its fields, or None")


def _arm_names(arg: str, names: object) -> tuple[str, str]:
    """Two arm names as typed, each one line of text; the same twice is refused (their runs would merge)."""
    allowed = f"two different names, e.g. {arg}=('config-a', 'config-a-bs8') (one line each, at most {_MAX_ARM_NAME})"
    if isinstance(names, str) or not isinstance(names, Sequence) or len(names) != 2:
        raise ConfigError(arg, names, allowed)
    first, second = names
    for name in (first, second):
        if not isinstance(name, str) or not name.strip() or not name.isprintable() or len(name) > _MAX_ARM_NAME:
            raise ConfigError(arg, names, allowed)
    if first == second:
        raise ConfigError(arg, names, allowed)
    return first, second


def _compare_plan(
    engine: Engine,
    a: object,
    b: object,
    names: object,
    a_overrides: Mapping[str, Any] | None,
    b_overrides: Mapping[str, Any] | None,
    changes: Mapping[str, Any],
) -> tuple[AnyConfig, AnyConfig, tuple[str, str]]:
    """Both arms of a comparison, resolved and checked, with their names: nothing is launched or written.

    ``b`` None means A again (with B's overrides: "A against A with a change"). Refused here: a config or
    override that is not valid (named as typed), a B identical to A, names that are not two different ones.
    """
    if b is not None and not isinstance(b, (str, ServerConfig, VllmConfig)):
        raise ConfigError(
            "b",
            b,
            "a config (preset, .toml/.json file, ServerConfig or VllmConfig) or None for A again; levels go in "
            "concurrency=",
        )
    for arg, mapping in (("a_overrides", a_overrides), ("b_overrides", b_overrides)):
        if mapping is not None and not isinstance(mapping, Mapping):
            raise ConfigError(arg, mapping, "a mapping of config fields to values, e.g. {'cuda_graph_max_bs': 8}")
    a_changes, b_changes = dict(a_overrides or {}), {**(b_overrides or {}), **changes}
    cfg_a: AnyConfig = engine.resolve_config(a, a_changes, arg="a")
    cfg_b: AnyConfig = engine.resolve_config(a if b is None else b, b_changes, arg="a" if b is None else "b")
    label_a = _arm_label(a, "A")
    same = b is None or (isinstance(b, str) and b == a) or b is a
    label_b = label_a if same else _arm_label(b, "B")
    typed = (label_a + _changes_text(a_changes), label_b + _changes_text(b_changes))
    changed = diff(cfg_a, cfg_b)
    if not [c for c in changed if c.field != "port"]:  # a launch picks each arm's port anyway
        raise ConfigError(
            "b",
            typed[1],
            f"a config that differs from A ({typed[0]}): the same config twice measures only noise; give B a "
            f"change, e.g. lab.launch_ab({label_a!r}, cuda_graph_max_bs=8), or another config",
            detail="the port is no difference: each server gets its own" if changed else "",
        )
    if names is None:
        chosen = typed if typed[0] != typed[1] else (f"{typed[0]} (A)", f"{typed[1]} (B)")
    else:
        chosen = _arm_names("names", names)
    return cfg_a, cfg_b, chosen


#: lab.launch_ab's own keywords: a keyword that is neither one of these nor a config field is a typo of either.
_COMPARE_KEYWORDS = (
    "names, a_overrides, b_overrides, repeats, prompts, input_len, output_len, seed, together, timeout_s, concurrency"
)


def _check_change_names(changes: Mapping[str, Any], field_names: Sequence[str]) -> None:
    """B's keyword changes are config fields (``cuda_graph_max_bs``, ``speculative__num_steps``, ``env__X``); any
    other keyword is refused naming both kinds (``repeat=1`` is a typo of ``repeats``, not a field to set)."""
    heads = {name.split(".", 1)[0] for name in field_names}
    for key, value in changes.items():
        if key.replace("__", ".").split(".", 1)[0] not in heads:
            raise ConfigError(
                key,
                value,
                f"a config field to change in B ({', '.join(field_names)}, env.NAME) or one of launch_ab's "
                f"keywords ({_COMPARE_KEYWORDS})",
            )


def _arm_label(config: object, fallback: str) -> str:
    """A config as its arm is called: the preset's name, the file's stem, or A/B for a ServerConfig."""
    if isinstance(config, str):
        return config if config in PRESETS else Path(config).stem
    return fallback


def _changes_text(changes: Mapping[str, Any]) -> str:
    """``+cuda_graph_max_bs=8+speculative.num_steps=2``: the overrides an arm's name carries."""
    return "".join(f"+{key.replace('__', '.')}={value}" for key, value in changes.items())


def _server_names(names: tuple[str, str]) -> tuple[str, str]:
    """Folder-safe server names for two arm names (``config_a+cuda_graph_max_bs=8`` -> ``config_a-cuda_...-8``)."""
    out = [re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-._")[:_MAX_ARM_NAME] or "arm" for name in names]
    return out[0], out[1]


def _compare_stopped(
    exc: KeyboardInterrupt, names: tuple[str, str], runs: list[bench.BenchRuns], started: float
) -> Interrupted:
    """The Stop of a comparison, carrying both arms' runs so far: run one after the other, the arm being
    measured hands over only its own."""
    partial = getattr(exc, "partial", None)
    if not isinstance(partial, bench.ABRuns):  # one arm after the other, or stopped while a server started
        arms = [*runs, *([partial] if isinstance(partial, bench.BenchRuns) else [])]
        a, b = (tuple(arms[i]) if i < len(arms) else () for i in (0, 1))
        partial = bench.ABRuns(a, b, names[0], names[1]) if arms else None
    return Interrupted(
        f"comparison {names[1]} vs {names[0]}",
        partial,
        after=exc.after if isinstance(exc, Interrupted) else "",
        elapsed_s=time.monotonic() - started,
        note="both servers are being stopped",
    )


def _interrupted(reason: str) -> Readiness:
    """The verdict of a launch the user stopped before any watch began."""
    return Readiness(Verdict.INTERRUPTED, reason, (), None, (), 0.0, None, None)


def _save_verdict(folder: Path, readiness: Readiness) -> None:
    with contextlib.suppress(OSError):
        write_json_atomic(folder / "readiness.json", readiness.to_dict())


# Sessions still open at interpreter exit stop their servers: a finished papermill run, a restarted
# kernel and a script that forgot close() must not leave GPUs held by orphans.
_LIVE: weakref.WeakSet[Lab] = weakref.WeakSet()


def _stop_everything() -> None:
    for lab in list(_LIVE):
        with contextlib.suppress(Exception):
            lab.close()


atexit.register(_stop_everything)
