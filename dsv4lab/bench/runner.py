"""Run a workload against a server with the built-in client: warmup, paced dispatch, death watch, result.

Load is generated from a fixed schedule (every request has a scheduled send time from the load's seed);
a concurrency cap is a semaphore whose waiting time is recorded per request, so a saturated server shows
up as queueing rather than disappearing from the latencies (no coordinated omission).

A server that dies mid-run must not leave a notebook hanging for the request timeout, nor throw away
what was measured. Any connection-level failure (refused connect, reset, a stream cut before its end)
triggers a connect probe of the server's port; a refused or timed-out probe — or three connection
failures within two seconds — aborts the run: pending requests are not sent, in-flight streams are cut,
and the result comes back ``partial`` with the caller's ``on_server_death()`` diagnosis attached.

The user stopping a run (the notebook's Stop button, Ctrl-C) is handled the same way: in-flight streams
are cut at once, what finished is kept, and the result comes back ``partial`` with ``interrupted`` set —
the blocking wrappers hand it over on :class:`~dsv4lab.errors.Interrupted`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import inspect
import math
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar, cast

from dsv4lab.atomicfile import to_jsonable
from dsv4lab.bench.client import ClientOptions, SessionRequest, prepare, prepare_session, send_request
from dsv4lab.bench.death import DEATH_ERRORS, DEATH_WINDOW_S, PROBE_TIMEOUT_S, DeathWatch
from dsv4lab.bench.httpstream import ConnectionPool, Endpoint
from dsv4lab.bench.metrics import SLO, RequestRecord, summarize
from dsv4lab.bench.results import BenchResult, BenchRuns, Provenance, ServerContext, records_frame
from dsv4lab.bench.serverinfo import (
    first_model_id,
    flush_cache,
    gpu_names,
    identify_engine,
    list_models,
    server_info,
    start_profile,
    stop_profile_later,
    stop_profile_quietly,
)
from dsv4lab.bench.store import ResultStore
from dsv4lab.bench.tokens import fit_workload
from dsv4lab.bench.twinsession import (
    CLOSE_AFTER_STOP_S,
    SESSION_TIMEOUT_S,
    TwinSession,
    close_twin_session,
    open_twin_session,
)
from dsv4lab.bench.workload import LoadSpec, RequestSpec, Workload, arrival_times, cap_levels
from dsv4lab.blocking import run_blocking, stoppable
from dsv4lab.counts import plural
from dsv4lab.errors import BenchError, Interrupted
from dsv4lab.hosts import LocalHost
from dsv4lab.progress import Progress, State
from dsv4lab.units import Clock, fmt_tok_s

__all__ = [
    "DEATH_ERRORS",
    "DEATH_WINDOW_S",
    "INTERRUPTED",
    "PROBE_TIMEOUT_S",
    "DeathWatch",
    "control_headers",
    "run",
    "run_async",
    "run_sync",
    "sweep",
    "sweep_async",
]

T = TypeVar("T")

#: After an abort, how long in-flight requests get to wind down before they are cancelled.
ABORT_GRACE_S = 3.0
#: The abort reason of a run the user stopped (Stop button, Ctrl-C).
INTERRUPTED = "interrupted by the user"


class _Run:
    """The state of one run: schedule, in-flight tasks, records, abort flag."""

    def __init__(self, endpoint: Endpoint, options: ClientOptions, pool: ConnectionPool) -> None:
        self.endpoint = endpoint
        self.options = options
        self.pool = pool
        self.abort = asyncio.Event()
        self.abort_reason: str | None = None
        self.abort_time: float | None = None
        self.interrupted = False
        self.watch = DeathWatch(endpoint, self._on_dead)

    def _on_dead(self, reason: str) -> None:
        if self.abort.is_set():  # the first reason stands: streams cut by an abort fail in turn
            return
        self.abort_reason = reason
        self.abort_time = time.perf_counter()
        self.abort.set()
        self.pool.abort_all()

    def interrupt(self) -> None:
        """The user stopped the run: cut everything now (no grace), keep what finished."""
        if not self.abort.is_set():
            self.interrupted = True
            self._on_dead(INTERRUPTED)

    async def _sleep_until(self, when: float) -> None:
        delay = when - time.perf_counter()
        if delay > 0:
            with contextlib.suppress(asyncio.TimeoutError, TimeoutError):
                await asyncio.wait_for(self.abort.wait(), timeout=delay)

    async def execute(
        self,
        specs: Sequence[RequestSpec],
        payloads: Sequence[bytes | SessionRequest],
        schedule: Sequence[float],
        cap: int | None,
        origin: float,
        on_done: Callable[[int, int], None],
        *,
        paced: bool = True,
    ) -> list[RequestRecord]:
        """Dispatch every request on its schedule under the cap; return one record per request.

        ``paced=False`` (a twin in virtual time, which places each request on its own clock from the
        announced schedule) sends each request as soon as the cap allows instead of waiting for its time.
        A cancellation (the user's Stop) does not escape: it aborts the run, and the records of what was
        done come back like after a server death.
        """
        n = len(specs)
        records: list[RequestRecord | None] = [None] * n
        sem = asyncio.Semaphore(cap if cap is not None else max(n, 1))
        tasks: list[asyncio.Task[None]] = []
        done = ok = 0

        async def one(i: int) -> None:
            nonlocal done, ok
            try:
                records[i] = await send_request(
                    self.pool,
                    specs[i],
                    payloads[i],
                    self.options,
                    scheduled_s=schedule[i],
                    origin=origin,
                    on_connection_error=self.watch.connection_error,
                )
            finally:
                sem.release()
                done += 1
                record = records[i]
                ok += record is not None and record.status == "ok"
                on_done(done, ok)

        try:
            for i in range(n):
                if paced:
                    await self._sleep_until(origin + schedule[i])
                if self.abort.is_set():
                    break
                await sem.acquire()
                await self.watch.settle()  # a failure is being probed: do not send into a server being found dead
                if self.abort.is_set():
                    sem.release()
                    break
                tasks.append(asyncio.get_running_loop().create_task(one(i)))
            if tasks:
                if self.abort.is_set():
                    _, pending = await asyncio.wait(tasks, timeout=ABORT_GRACE_S)
                    await _cancel_all(pending)
                else:
                    await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            self.interrupt()
            await _cancel_all([t for t in tasks if not t.done()])
        now = time.perf_counter()
        out: list[RequestRecord] = []
        for i, rec in enumerate(records):
            if rec is None:
                sent = i < len(tasks)
                why = "stopped by the user" if self.interrupted else "the run was aborted"
                rec = RequestRecord(
                    index=specs[i].index,
                    status="incomplete" if sent else "not_sent",
                    scheduled_s=schedule[i],
                    start_s=(now - origin) if sent else None,
                    prompt_tokens=specs[i].prompt_len,
                    error=f"cancelled: {why}" if sent else f"not sent: {why}",
                )
            elif self.abort.is_set() and rec.status != "ok" and not rec.error.startswith("run aborted"):
                rec = dataclasses.replace(rec, error=f"run aborted ({self.abort_reason}); {rec.error}")
            out.append(rec)
        return out


async def _cancel_all(tasks: Sequence[asyncio.Task[Any]] | set[asyncio.Task[Any]]) -> None:
    """Cancel tasks and wait until they have ended (a cancelled stream closes its socket on the way out)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def _warmup_specs(workload: Workload, count: int) -> list[RequestSpec]:
    reqs = workload.requests
    return [reqs[i % len(reqs)] for i in range(count)]


#: How often (s) a run asks whether the server's process still runs, when the caller can tell.
PROCESS_POLL_S = 1.0


async def _watch_process(state: _Run, alive: Callable[[], bool]) -> None:
    """End the run when the server's process is gone: its connections alone do not always say so (through
    an SSH tunnel, or when a child process inherited the listening socket, a dead server's port can accept
    and never answer). A failed check decides nothing: the host may be slow to answer."""
    while not state.abort.is_set():
        await asyncio.sleep(PROCESS_POLL_S)
        try:
            running = await asyncio.to_thread(alive)
        except Exception:  # noqa: S112 - a host that cannot answer now says nothing about the server
            continue
        if not running:
            state.watch.server_gone("the server's process is no longer running")
            return


async def _diagnose(on_server_death: Callable[[], object] | None, timeout_s: float) -> object:
    if on_server_death is None:
        return None
    try:
        return await asyncio.wait_for(asyncio.to_thread(on_server_death), timeout=timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        return f"on_server_death() did not return within {timeout_s:g} s"
    except Exception as exc:
        return f"on_server_death() failed: {exc!r}"


def control_headers(options: ClientOptions) -> dict[str, str]:
    """Headers for the run's side requests (info, flush, profile): the user's headers and API key, so a
    server behind a key answers them too."""
    headers = dict(options.headers)
    if options.api_key:
        headers["Authorization"] = f"Bearer {options.api_key}"
    return headers


async def run_async(
    url: str,
    workload: Workload,
    load: LoadSpec | None = None,
    options: ClientOptions | None = None,
    *,
    slo: SLO | None = None,
    label: str = "",
    repeat: int = 0,
    progress: bool | Progress = True,
    on_server_death: Callable[[], object] | None = None,
    diagnosis_timeout_s: float = 60.0,
    server: ServerContext | None = None,
    store: ResultStore | str | None = None,
    info_timeout_s: float = 10.0,
    profile: bool = False,
    profile_output_dir: str | None = None,
) -> BenchResult:
    """Benchmark ``workload`` against the server at ``url`` (e.g. ``http://127.0.0.1:30000``).

    ``server`` is what the caller knows of the server (its host and config for the provenance; its
    ``/server_info`` and GPU names to skip those lookups): see :class:`ServerContext`. With ``store`` the
    result is appended to that run directory's result store. ``progress`` is a bool or a
    :class:`~dsv4lab.progress.Progress` to report into (a sweep shares one). Cancelling the task (the
    user's Stop) returns the partial result instead of raising. ``profile`` runs the server's torch
    profiler over the measured requests (not the warmup), traces in ``profile_output_dir`` on the server
    host; the server's answer to ``/stop_profile`` is kept in ``BenchResult.profile``. Random prompts are
    first remade under the server's tokenizer where it has one (:func:`~dsv4lab.bench.tokens.fit_workload`),
    so the provenance's workload is the one sent.
    """
    load = load or LoadSpec()
    options = options or ClientOptions()
    endpoint = Endpoint.parse(url)
    headers = control_headers(options)
    desc = f"{label + ' ' if label else ''}c={load.concurrency if load.concurrency is not None else 'inf'}"
    own_progress = not isinstance(progress, Progress)
    reporter = progress if isinstance(progress, Progress) else Progress(f"bench {desc}", enabled=progress)
    server = server or ServerContext()
    reporter.update(f"{desc} asking the server", fraction=0.0)
    provenance, info, model, workload = await _describe(
        endpoint, workload, load, options, server, headers, info_timeout_s
    )
    pool = ConnectionPool(endpoint, connect_timeout_s=options.connect_timeout_s)
    state = _Run(endpoint, options, pool)
    specs = list(workload.requests)
    clock = Clock.from_server_info(info)
    key = f"{label}|c={load.concurrency}|rate={load.request_rate}|repeat={repeat}|n={len(specs)}"
    steps = _Steps(state, workload, load, model, headers, reporter, desc, clock, key)  # the run's clock starts here
    watchdog = asyncio.create_task(_watch_process(state, server.alive)) if server.alive is not None else None
    try:
        records = await steps.measure(specs, profile, profile_output_dir, own_progress=own_progress)
    finally:
        await _cancel_all([watchdog] if watchdog is not None else [])
    duration = _duration(records, state, steps.origin)
    profile_answer = await steps.stop_profiler()
    dead = state.abort.is_set() and not state.interrupted
    diagnosis = await _diagnose(on_server_death, diagnosis_timeout_s) if dead else None
    if server.info is None and not state.abort.is_set():  # the accept length of *this* run, as bench_serving reads it
        info = await server_info(endpoint.url, timeout_s=info_timeout_s, headers=headers) or info
    result = BenchResult(
        summary=summarize(records, duration, slo=slo, accept_length=_accept_length(info), itl_unit=options.itl_unit),
        requests=records_frame(records, itl_unit=options.itl_unit),
        provenance=provenance,
        concurrency=load.concurrency,
        request_rate=load.request_rate,
        repeat=repeat,
        label=label,
        partial=state.abort.is_set(),
        abort_reason=state.abort_reason,
        diagnosis=diagnosis,
        origin_perf_s=steps.origin,
        interrupted=state.interrupted,
        profile=profile_answer,
        wall_duration_s=steps.wall_duration_s,
    )
    if store is not None:
        (store if isinstance(store, ResultStore) else ResultStore(store)).append(result)
    if own_progress:
        _finish(reporter, result)
    return result


async def _describe(
    endpoint: Endpoint,
    workload: Workload,
    load: LoadSpec,
    options: ClientOptions,
    server: ServerContext,
    headers: Mapping[str, str],
    timeout_s: float,
) -> tuple[Provenance, Mapping[str, Any], str | None, Workload]:
    """The result's provenance, with the server's info, the model name the requests carry and the workload
    as it will be sent (random prompts remade under the server's tokenizer: :mod:`.tokens`); what the
    caller did not give is asked of the server (``/server_info``, ``/v1/models``, ``/version``) and its
    host (the GPUs)."""
    base, host, config = endpoint.url, server.host, server.config
    info = server.info if server.info is not None else await server_info(base, timeout_s=timeout_s, headers=headers)
    models = await list_models(base, timeout_s=timeout_s, headers=headers)
    model = options.model
    if model is None and options.api != "generate":
        model = first_model_id(models)
    gpus = server.gpus
    if gpus is None:
        gpus = await asyncio.to_thread(gpu_names, host) if host is not None else ()
    engine, version, engine_from = await identify_engine(base, info, models, timeout_s=timeout_s, headers=headers)
    workload = await fit_workload(
        base,
        workload,
        api=options.api,
        model=model if model is not None else first_model_id(models),
        headers=headers,
        host=host if host is not None else (LocalHost() if _is_loopback(endpoint.host) else None),
        model_folders=_model_folders(models, info, config),
        engine=engine,
    )
    config_dict = config.to_dict() if config is not None else None
    provenance = Provenance(
        url=base,
        backend="dsv4lab",
        api=options.api,
        engine=engine,
        engine_version=version,
        engine_from=engine_from,
        host=host.name if host is not None else endpoint.host,
        gpu_names=tuple(gpus),
        workload=workload.to_dict(),
        load=load.to_dict(),
        client_options={**options.to_dict(), "model": model},
        config=to_jsonable(config_dict) if config_dict is not None else None,
        server_info=to_jsonable(dict(info)),
    )
    return provenance, info, model, workload


def _is_loopback(host: str) -> bool:
    """A server on this machine (its model folder, if it names one, is readable here)."""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


def _model_folders(models: Sequence[Mapping[str, Any]], info: Mapping[str, Any], config: Any) -> list[str]:
    """Where the model's files may be: ``/v1/models``' ``root`` (vLLM), SGLang's ``model_path`` and
    ``tokenizer_path``, the launch config's ``model_path``."""
    found = [models[0].get("root")] if models else []
    found += [info.get("tokenizer_path"), info.get("model_path"), getattr(config, "model_path", None)]
    return [str(f) for f in found if isinstance(f, str) and f]


@dataclasses.dataclass
class _Steps:
    """A benchmark's steps around its :class:`_Run`, in order: warm up, flush the cache, connect and start
    the profiler, dispatch the measured requests on the clock started just before, stop the profiler."""

    state: _Run
    workload: Workload
    load: LoadSpec
    model: str | None
    headers: dict[str, str]
    reporter: Progress
    desc: str
    #: The server's clock: against the twin every request is sent in an announced session.
    clock: Clock
    #: Names the run to the twin, whose random streams for it follow from the name (the same run, the
    #: same draws, whatever ran before it).
    key: str
    #: When the measured requests' clock starts (``perf_counter``); until then, when the run began.
    origin: float = dataclasses.field(default_factory=time.perf_counter)
    profiling: bool = False
    #: Wall seconds the measured requests took on this machine (None until they ended).
    wall_duration_s: float | None = None

    @property
    def base(self) -> str:
        return self.state.endpoint.url

    async def measure(
        self,
        specs: Sequence[RequestSpec],
        profile: bool,
        profile_output_dir: str | None,
        *,
        own_progress: bool,
    ) -> list[RequestRecord]:
        """Warmup to the last measured request, the cyclic GC paused over the measured part. The user's Stop
        returns what was done; a Stop before any request went out leaves nothing to keep and propagates."""
        state = self.state
        gc_was_enabled = gc.isenabled()
        try:
            await self.warmup()
            schedule = await self.prepare(len(specs), profile, profile_output_dir)
            async with self.announced(specs, schedule, self.load.concurrency, self.key) as payloads:
                gc.disable()  # a cyclic-GC pause would land in some request's TTFT or ITL; collected after the run
                self.origin = time.perf_counter()
                try:
                    return await self.dispatch(specs, payloads, schedule)
                finally:
                    self.wall_duration_s = time.perf_counter() - self.origin
        except asyncio.CancelledError:
            if not state.interrupted:  # stopped before any request went out: there is nothing to keep
                if own_progress:
                    self.reporter.finish("stopped by the user", "warn")
                raise
            return [RequestRecord(s.index, "not_sent", 0.0, error="not sent: stopped by the user") for s in specs]
        finally:
            if gc_was_enabled:
                gc.enable()
            state.watch.cancel()
            state.pool.close()

    async def warmup(self) -> None:
        load, state = self.load, self.state
        if not load.warmup:
            return
        warm = _warmup_specs(self.workload, load.warmup)
        cap = min(load.warmup, load.concurrency or load.warmup)
        self.reporter.update(f"{self.desc} warmup", fraction=0.0, detail=plural(len(warm), "request"))
        schedule = [0.0] * len(warm)
        async with self.announced(warm, schedule, cap, self.key + "|warmup") as payloads:
            await state.execute(
                warm, payloads, schedule, cap, time.perf_counter(), lambda _k, _ok: None, paced=self.paced
            )
        await state.watch.settle()

    @property
    def paced(self) -> bool:
        """Whether requests wait for their scheduled time on this machine's clock (all but a virtual twin)."""
        return self.clock.kind != "twin-virtual"

    @contextlib.asynccontextmanager
    async def announced(
        self, specs: Sequence[RequestSpec], schedule: Sequence[float], cap: int | None, key: str
    ) -> AsyncIterator[list[bytes | SessionRequest]]:
        """The requests' payloads; against the twin, inside a session that announces the run
        (:mod:`.twinsession`), closed when the run ends or is stopped."""
        state = self.state
        session: TwinSession | None = None
        if self.clock.is_twin and not state.abort.is_set():
            session = await open_twin_session(self.base, schedule, cap, key, headers=self.headers)
        try:
            yield _payloads(state.endpoint, specs, state.options, self.model, session)
        finally:
            if session is not None:
                timeout = CLOSE_AFTER_STOP_S if state.interrupted else SESSION_TIMEOUT_S
                await close_twin_session(self.base, session, headers=self.headers, timeout_s=timeout)

    async def prepare(self, n: int, profile: bool, profile_output_dir: str | None) -> list[float]:
        """Flush the cache, open the connections (``ttft_clock="send"``), start the profiler; the schedule."""
        load, state = self.load, self.state
        if load.flush_cache and not state.abort.is_set():
            self.reporter.update(f"{self.desc} flush cache", fraction=0.0)
            await flush_cache(self.base, headers=self.headers)
        schedule = arrival_times(n, load)
        if not state.abort.is_set() and state.options.ttft_clock == "send":
            await state.pool.preconnect(min(load.concurrency or n, n))
        if profile and not state.abort.is_set():
            await start_profile(self.base, output_dir=profile_output_dir, headers=self.headers)
            self.profiling = True
        return schedule

    async def dispatch(
        self, specs: Sequence[RequestSpec], payloads: Sequence[bytes | SessionRequest], schedule: Sequence[float]
    ) -> list[RequestRecord]:
        """The measured requests, or none sent when the warmup already ended the run."""
        state, reporter, desc = self.state, self.reporter, self.desc
        if state.abort.is_set():
            why = (
                "stopped by the user" if state.interrupted else f"the server died during warmup ({state.abort_reason})"
            )
            return [
                RequestRecord(s.index, "not_sent", t, error=f"not sent: {why}")
                for s, t in zip(specs, schedule, strict=True)
            ]
        total = len(specs)
        reporter.update(desc, fraction=0.0, detail=f"0/{total} {plural(total, 'request', number=False)}, 0 ok")

        def on_done(k: int, ok: int) -> None:
            # Finished is not ok: the table counts ok requests, so the line says both.
            reporter.update(fraction=k / total, detail=f"{k}/{total} {plural(total, 'request', number=False)}, {ok} ok")

        records = await state.execute(
            specs, payloads, schedule, self.load.concurrency, self.origin, on_done, paced=self.paced
        )
        # The last requests failing can end the run while the probe they started is still asking: its
        # answer decides whether this is a finished run with errors or one cut by a dead server.
        await state.watch.settle()
        return records

    async def stop_profiler(self) -> str | None:
        """The server's answer to /stop_profile; after the user's Stop the profiler is stopped in the
        background, since Stop must return now."""
        if not self.profiling:
            return None
        if self.state.interrupted:
            stop_profile_later(self.base, self.headers)
            return "stopped in the background after the user's Stop"
        return await stop_profile_quietly(self.base, self.headers, quiet=self.state.abort.is_set())


def _duration(records: Sequence[RequestRecord], state: _Run, origin: float) -> float:
    """From the clock's start to the last request's end, or to the abort when that came later."""
    ends = [r.start_s + r.end_s for r in records if r.start_s is not None and r.end_s is not None]
    duration = max(ends, default=0.0)
    if state.abort_time is not None:
        duration = max(duration, state.abort_time - origin) if ends else max(0.0, state.abort_time - origin)
    return duration


def _payloads(
    endpoint: Endpoint,
    specs: Sequence[RequestSpec],
    options: ClientOptions,
    model: str | None,
    session: TwinSession | None = None,
) -> list[bytes | SessionRequest]:
    """Request bytes for the pool (clock from the send), or session requests whose encoding and connection
    fall inside the clock (``ttft_clock="connect"``, bench_serving's way); each with its place in the twin's
    session, when there is one."""
    make = prepare_session if options.ttft_clock == "connect" else prepare
    return [make(endpoint, s, options, model, session.headers(i) if session else None) for i, s in enumerate(specs)]


def _finish(reporter: Progress, result: BenchResult) -> None:
    s = result.on_hardware
    counts = f"{s.completed}/{s.total} {plural(s.total, 'request', number=False)} ok"
    if result.partial:
        state: State = "warn" if result.interrupted else "fail"  # the user's Stop is no failure: amber, not red
        reporter.finish(f"PARTIAL: {result.abort_reason}", state, detail=counts)
    elif s.completed == 0:
        reporter.finish(f"FAILED: no request completed ({result.failure})", "fail", detail=counts)
    else:
        reporter.finish(f"done: {fmt_tok_s(s.output_throughput)} output{result.clock.tag}", "ok", detail=counts)


def first_error(result: BenchResult) -> str:
    """Why a run's requests failed, as the server or the connection said (:attr:`BenchResult.failure`)."""
    return result.failure or "no error recorded"


def _accept_length(info: Mapping[str, Any]) -> float | None:
    """Speculative accept length from server_info (``internal_states[0].avg_spec_accept_length``)."""
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


async def sweep_async(
    url: str,
    workload: Workload | Callable[[int], Workload] | Callable[[int | None], Workload],
    concurrencies: Sequence[int | None] | int | str | None,
    *,
    repeats: int = 1,
    load: LoadSpec | None = None,
    options: ClientOptions | None = None,
    slo: SLO | None = None,
    label: str = "",
    progress: bool | Progress = True,
    on_server_death: Callable[[], object] | None = None,
    server: ServerContext | None = None,
    store: ResultStore | str | None = None,
    profile: bool = False,
    profile_output_dir: str | None = None,
) -> BenchRuns:
    """:func:`run_async` at each concurrency level, ``repeats`` times each. ``workload`` may be a function of
    the level (e.g. more prompts at higher concurrency). A level of ``None`` (or ``"inf"`` in text) is no
    cap: every request may be in flight, as SGLang's ``bench_serving`` without ``--max-concurrency``.
    Stops after a run that ended early (the server died, or the user stopped it); the runs so far come
    back, the last one partial."""
    reporter = progress if isinstance(progress, Progress) else Progress(f"sweep {label}".strip(), enabled=progress)
    runs: list[BenchResult] = []
    options_kw = {
        "slo": slo,
        "on_server_death": on_server_death,
        "server": server,
        "store": store,
        "profile": profile,
        "profile_output_dir": profile_output_dir,
    }
    await _sweep_into(runs, url, workload, concurrencies, repeats, load, options, label, reporter, options_kw)
    if not isinstance(progress, Progress):
        _finish_sweep(reporter, runs)
    return BenchRuns(runs)


async def _sweep_into(
    runs: list[BenchResult],
    url: str,
    workload: Workload | Callable[[int], Workload] | Callable[[int | None], Workload],
    concurrencies: Sequence[int | None] | int | str | None,
    repeats: int,
    load: LoadSpec | None,
    options: ClientOptions | None,
    label: str,
    reporter: Progress,
    run_kw: Mapping[str, Any],
) -> None:
    """The sweep itself, appending each run to ``runs`` as it ends, so a stopped sweep keeps them (and each"""
    if repeats < 1:
        raise BenchError(f"repeats must be >= 1, got {repeats}")
    levels = cap_levels(concurrencies)
    planned = len(levels) * repeats
    for level in levels:
        wl = cast("Callable[[int | None], Workload]", workload)(level) if callable(workload) else workload
        for r in range(repeats):
            shown = "inf" if level is None else level
            what = f"run {len(runs) + 1}/{planned}: c={shown} repeat {r + 1}"
            reporter.update(what, fraction=0.0)
            load_c = dataclasses.replace(load or LoadSpec(), concurrency=level)
            result = await run_async(url, wl, load_c, options, label=label, repeat=r, progress=reporter, **run_kw)
            runs.append(result)
            reporter.kept = BenchRuns(runs)
            if result.partial:
                return


def _finish_sweep(reporter: Progress, runs: Sequence[BenchResult]) -> None:
    if runs and runs[-1].partial:
        _finish(reporter, runs[-1])
        return
    done = [x for x in runs if x.summary.completed]
    if runs and not done:
        reporter.finish(
            f"FAILED: no request completed in {plural(len(runs), 'run')} ({first_error(runs[0])})",
            "fail",
            detail=_ok_detail(runs),
        )
        return
    best = max(done, key=lambda x: x.on_hardware.output_throughput, default=None)
    text = f"done: {plural(len(runs), 'run')}"
    if best is not None:
        c = "unlimited" if best.concurrency is None else best.concurrency
        text += f", best {fmt_tok_s(best.on_hardware.output_throughput)} output at concurrency {c}{best.clock.tag}"
    failed = [x for x in runs if not x.summary.completed]
    if failed:  # a run that measured nothing is no data point: say so beside the best of the others
        text += f"; {len(failed)} failed ({first_error(failed[0])})"
    reporter.finish(text, "ok" if len(done) == len(runs) else "warn", detail=_ok_detail(runs))


def _requests_ok(result: BenchResult) -> str:
    """A run's requests as its table counts them: the ok ones of all it planned."""
    return f"{result.summary.completed} of {plural(result.summary.total, 'request')} ok"


def _ok_detail(runs: Sequence[BenchResult]) -> str:
    """The runs' ok requests, in the table's terms (a run's last live count was of finished requests)."""
    ok = sum(r.summary.completed for r in runs)
    total = sum(r.summary.total for r in runs)
    return f"{ok}/{total} {plural(total, 'request', number=False)} ok"


def runs_after(runs: Sequence[BenchResult], planned: int | None) -> str:
    """How far a stopped series of runs got: finished runs of those planned, and the cut one's requests."""
    finished = [r for r in runs if not r.partial]
    counted = len(finished) if planned is None else planned
    of = "" if planned is None else f" of {planned}"
    text = f"after {len(finished)}{of} {plural(counted, 'run', number=False)}"
    cut = runs[-1] if runs and runs[-1].partial else None
    if cut is not None:
        level = "inf" if cut.concurrency is None else cut.concurrency
        text += f"; the cut run (c={level}) had {_requests_ok(cut)}"
    return text


def _planned(concurrencies: Sequence[int | None] | int | str | None, repeats: int) -> int | None:
    try:
        return len(cap_levels(concurrencies)) * repeats
    except BenchError:
        return None


def _shown_levels(concurrencies: Sequence[int | None] | int | str | None) -> str:
    try:
        return ", ".join("inf" if c is None else str(c) for c in cap_levels(concurrencies))
    except BenchError:
        return str(concurrencies)


def run_sync(coro: Coroutine[Any, Any, T], *, what: str = "benchmark", progress: Progress | None = None) -> T:
    """Run a coroutine to completion from plain code or a notebook cell; Stop cancels it and raises
    :class:`~dsv4lab.errors.Interrupted` with its partial result."""
    return run_blocking(coro, what=what, on_tick=progress.tick if progress is not None else None)


def _run_title(call: inspect.BoundArguments) -> str:
    load, label = call.arguments["load"] or LoadSpec(), call.arguments["label"]
    return f"bench {label + ' ' if label else ''}c={load.concurrency or 'inf'}"


def _run_stopped(reporter: Progress, partial: Any, call: inspect.BoundArguments) -> Interrupted:
    if isinstance(partial, BenchResult):
        _finish(reporter, partial)
    else:
        reporter.finish("stopped by the user", "warn")
    reporter.tick()
    after = f"after {_requests_ok(partial)}" if isinstance(partial, BenchResult) else "before it measured"
    what = "benchmark " + _run_title(call).removeprefix("bench ")
    return Interrupted(what, partial, after=after, elapsed_s=reporter.elapsed_s)


#: :func:`run_async` as a blocking call (one signature: see :func:`dsv4lab.blocking.stoppable`).
run = stoppable(title=_run_title, done=_finish, stopped=_run_stopped)(run_async)


def _sweep_title(call: inspect.BoundArguments) -> str:
    return f"sweep {call.arguments['label']}".strip()


def _sweep_stopped(reporter: Progress, partial: Any, call: inspect.BoundArguments) -> Interrupted:
    runs = list(partial) if isinstance(partial, BenchRuns) else []
    a = call.arguments
    after = runs_after(runs, _planned(a["concurrencies"], a["repeats"]))
    reporter.finish(f"stopped by the user {after}", "warn", detail=_ok_detail(runs))
    reporter.tick()
    what = f"{_sweep_title(call)} at c={_shown_levels(a['concurrencies'])}"
    return Interrupted(what, BenchRuns(runs), after=after, elapsed_s=reporter.elapsed_s)


#: :func:`sweep_async` as a blocking call; Stop keeps the finished runs and the partial one (a
#: :class:`BenchRuns` on :class:`~dsv4lab.errors.Interrupted`'s ``partial``).
sweep = stoppable(title=_sweep_title, done=_finish_sweep, stopped=_sweep_stopped)(sweep_async)
