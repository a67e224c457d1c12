"""What the diagnosis remembers about one server run while the events stream past.

Bounded on purpose: per-rank figures (a few numbers per GPU), the errors (capped), the last progress
line per rank and a handful of flags. A multi-GB log therefore diagnoses in the same memory as a short
one. When a second run starts in the same file the previous run's state is kept (only one) so a log that
ends with a stray fragment of another run can still be judged by the run that has content.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dsv4lab.logs.events import (
    Capacity,
    DecodeBatch,
    DeviceMap,
    DistInit,
    Engine,
    ErrorEvent,
    Event,
    GraphCapture,
    GraphProgress,
    KVCache,
    MemoryPoolEnd,
    Phase,
    PhaseChange,
    PrefillBatch,
    RunEnd,
    ServerArgs,
    VllmMemoryProfile,
    WeightLoad,
)
from dsv4lab.logs.patterns import REQUEST_SERVED

__all__ = ["RankState", "RunState"]


def _older(ts: str, than: str) -> bool:
    """``ts`` is before ``than`` (same-format timestamps only; others count as not older)."""
    return bool(ts) and len(ts) == len(than) and ts < than


_MAX_ERRORS = 64
_BATCHES = frozenset({DecodeBatch, PrefillBatch})
_MAX_RANKS = 4096


def _traffic(ev: Event) -> bool:
    """A batch line after the ready line that is a served request, not a probe. SGLang's ``/health`` runs a
    one-token generation of ``input_ids=[0]`` (``health_generate``): a prefill of one sequence of one token,
    never a decode step. vLLM logs its stats line at INFO only when the engine was not idle."""
    if isinstance(ev, PrefillBatch):
        st = ev.stats
        return (st.new_tokens or 0) > 1 or (st.new_seq or 0) > 1
    return True


@dataclass
class RankState:
    """Memory figures and progress of one rank (``None`` key = lines without a rank tag)."""

    pre: float | None = None
    post: float | None = None
    weights: float | None = None
    kv: float | None = None
    kv_tokens: int | None = None
    pool_end: float | None = None
    capture_avail: float | None = None
    graphs: float = 0.0
    phase: Phase | None = None
    last_progress: Event | None = None
    last_progress_line: int = 0
    last_progress_ts: str = ""  # timestamp of the line at last_progress_line (as the run last saw it)
    capture_role: str | None = None
    phase_ts: str = ""  # timestamp of the line that set ``phase`` (late lines do not move it back)


@dataclass
class RunState:
    """Accumulates the events of one run (see the module docstring)."""

    events: int = 0
    content: int = 0
    errors: list[ErrorEvent] = field(default_factory=list)
    dropped_errors: int = 0
    ranks: dict[int | None, RankState] = field(default_factory=dict)
    phase: Phase | None = None
    last_progress: Event | None = None
    ready_line: int = 0
    api_up_line: int = 0
    batches_after_api: int = 0  # batch lines after the HTTP server came up (2+: real traffic, not the warmup)
    traffic_line: int = 0  # the first sign of served requests after the ready line (see ``_traffic``)
    traffic_what: str = ""
    visible: tuple[int, ...] | None = None  # the CUDA_VISIBLE_DEVICES the log shows
    last_batch_line: int = 0
    last_batch_ts: str = ""
    batches: int = 0
    startup_events: int = 0
    capacity: Capacity | None = None
    server_args: ServerArgs | None = None
    vllm_util: float | None = None
    vllm_total: float | None = None
    vllm_kv: float | None = None
    graph_bar_done: bool = False
    graph_bar_open: GraphProgress | None = None
    graph_finished: bool = False
    kv_seen: bool = False
    max_bs_seen: int | None = None
    new_style: bool = False
    ended: RunEnd | None = None
    followed_by_run: bool = False
    first_line: int = 0
    last_line: int = 0
    engines: set[Engine] = field(default_factory=set)
    max_rank: int | None = None
    engine_ready: bool = False  # vLLM: "init engine (profile, create kv cache, warmup model) took ..."
    cur_ts: str = ""  # the last timestamp seen, in line order (for lines that carry none)
    phase_ts: str = ""

    def rank(self, r: int | None) -> RankState:
        st = self.ranks.get(r)
        if st is None:
            st = RankState()
            if len(self.ranks) < _MAX_RANKS:
                self.ranks[r] = st
        return st

    def _progress(self, ev: Event, phase: Phase) -> None:
        """Record that ``ev`` proves ``phase``; a line older than the one that set the phase is not progress.

        Workers interleave and Ray prints its deduplicated lines seconds late, so line order is not time
        order: a phase only moves on a line at least as new as the one that set it.
        """
        ts = ev.ts or self.cur_ts
        st = self.rank(ev.rank)
        if not _older(ts, st.phase_ts):
            st.phase = phase
            st.phase_ts = ts
            st.last_progress = ev
            st.last_progress_line = ev.line_no
            st.last_progress_ts = ts
        if not _older(ts, self.phase_ts):
            self.phase = phase
            self.phase_ts = ts
            self.last_progress = ev
        self.startup_events += 1

    def add(self, ev: Event) -> None:
        """Fold one event into the run (batch-stats lines, most of a serving log, take the short path)."""
        self.events += 1
        n = ev.line_no
        if not self.first_line:
            self.first_line = n
        self.last_line = n
        if ev.engine is not None:
            self.engines.add(ev.engine)
        r = ev.rank
        if r is not None and (self.max_rank is None or r > self.max_rank):
            self.max_rank = r
        if type(ev) in _BATCHES:
            self._on_batch(ev)
            return
        if ev.ts is not None:
            self.cur_ts = ev.ts
        self.content += 1
        handler = _HANDLERS.get(type(ev))
        if handler is None:
            self.content -= 1  # warnings and kernel configs say nothing about progress
        else:
            handler(self, ev)

    def _on_batch(self, ev: Event) -> None:
        n = ev.line_no
        self.content += 1
        self.batches += 1
        if self.api_up_line:
            self.batches_after_api += 1
        if self.ready_line and not self.traffic_line and _traffic(ev):
            self.traffic_line = n
            self.traffic_what = "batch stats"
        self.last_batch_line = n
        self.last_batch_ts = ev.ts or self.cur_ts
        st = self.ranks.get(ev.rank)
        st = st if st is not None else self.rank(ev.rank)
        st.last_progress_line = n
        st.last_progress_ts = self.last_batch_ts
        if self.ready_line or self.startup_events == 0:
            self.phase = Phase.SERVING  # before the ready line a batch is the warmup request

    def _on_error(self, ev: ErrorEvent) -> None:
        if len(self.errors) < _MAX_ERRORS:
            self.errors.append(ev)
        else:
            self.dropped_errors += 1

    def _on_weight_load(self, ev: WeightLoad) -> None:
        st = self.rank(ev.rank)
        if ev.stage == "begin":
            if st.pre is None:
                st.pre = ev.avail_gib
            self._progress(ev, Phase.WEIGHT_LOADING)
        else:
            if st.post is None:
                st.post = ev.avail_gib
                st.weights = ev.usage_gib
            self._progress(ev, Phase.KV_CACHE_ALLOC)
        if ev.elapsed_s is not None:
            self.new_style = True

    def _on_kv_cache(self, ev: KVCache) -> None:
        st = self.rank(ev.rank)
        if st.kv is None:
            st.kv = ev.size_gib
            st.kv_tokens = ev.tokens
        self.kv_seen = True
        # vLLM checks the pool against the context after sizing it; capture starts with its own line.
        self._progress(ev, Phase.KV_CACHE_ALLOC)
        if ev.dtype is not None:
            self.new_style = True

    def _on_pool_end(self, ev: MemoryPoolEnd) -> None:
        st = self.rank(ev.rank)
        if st.pool_end is None:
            st.pool_end = ev.avail_gib
        self._progress(ev, Phase.CUDA_GRAPH_CAPTURE)

    def _on_graph_capture(self, ev: GraphCapture) -> None:
        st = self.rank(ev.rank)
        if ev.bs:
            self.max_bs_seen = max(max(ev.bs), self.max_bs_seen or 0)
        if ev.graph in ("verify", "prefill") or ev.backend is not None:
            self.new_style = True
        draft = ev.role == "draft"
        if ev.stage in ("begin", "plan"):
            st.capture_role = ev.role
            if ev.avail_gib is not None:
                st.capture_avail = ev.avail_gib
            self._progress(ev, Phase.DRAFT_CUDA_GRAPH_CAPTURE if draft else Phase.CUDA_GRAPH_CAPTURE)
            return
        if ev.usage_gib is not None:
            st.graphs += ev.usage_gib
        if ev.engine is Engine.VLLM:
            self.graph_finished = True
        self._progress(ev, Phase.WARMUP if ev.engine is Engine.VLLM else Phase.STARTUP_OTHER)

    def _on_graph_progress(self, ev: GraphProgress) -> None:
        if ev.bs is not None:
            self.max_bs_seen = max(ev.bs, self.max_bs_seen or 0)
        st = self.rank(ev.rank)
        draft = st.capture_role == "draft" or (self.phase is Phase.DRAFT_CUDA_GRAPH_CAPTURE and st.capture_role is None)
        if ev.avail_gib is not None:
            st.capture_avail = ev.avail_gib
        if ev.label.startswith("registering"):
            if ev.engine is Engine.VLLM:  # vLLM registers the graphs' buffers once capture is over
                self.graph_finished = True
                self._progress(ev, Phase.WARMUP)
            return
        if ev.done is not None and ev.total is not None:
            if ev.done >= ev.total > 0:
                self.graph_bar_done = True
                self.graph_bar_open = None
            else:
                self.graph_bar_open = ev
                self.graph_bar_done = False
        self._progress(ev, Phase.DRAFT_CUDA_GRAPH_CAPTURE if draft else Phase.CUDA_GRAPH_CAPTURE)

    def _on_capacity(self, ev: Capacity) -> None:
        self.capacity = ev
        self._progress(ev, Phase.WARMUP)

    def _on_phase_change(self, ev: PhaseChange) -> None:
        if ev.what == REQUEST_SERVED:
            if self.ready_line and not self.traffic_line:
                self.traffic_line = ev.line_no
                self.traffic_what = "a request's access line"
            return
        if ev.what == "engine initialised":
            self.engine_ready = True
        if ev.ready:
            self.ready_line = ev.line_no
        elif ev.phase is Phase.WARMUP and ev.what in ("uvicorn running", "application startup complete"):
            self.api_up_line = ev.line_no
        self._progress(ev, ev.phase)

    def _on_dist_init(self, ev: DistInit) -> None:
        self._progress(ev, Phase.STARTUP_OTHER)
        if ev.text and "Init parallel" in ev.text:
            self.new_style = True

    def _on_server_args(self, ev: ServerArgs) -> None:
        self.server_args = ev
        if ev.get("cuda_graph_max_bs_decode") is not None or "cuda_graph_max_bs_decode" in ev.args:
            self.new_style = True
        self.content -= 1  # arguments alone do not make a run worth diagnosing

    def _on_vllm_memory(self, ev: VllmMemoryProfile) -> None:
        if ev.utilization is not None:
            self.vllm_util = ev.utilization
        if ev.total_gib is not None:
            self.vllm_total = ev.total_gib
        if ev.kv_gib is not None:
            self.vllm_kv = ev.kv_gib
        self.kv_seen = True
        self._progress(ev, Phase.KV_CACHE_ALLOC)

    def _on_run_end(self, ev: RunEnd) -> None:
        self.ended = ev

    def _on_device_map(self, ev: DeviceMap) -> None:
        self.visible = ev.visible
        self.content -= 1  # a shell line says nothing about the run's progress


# One handler per event type (``add`` looks the event's exact type up: events are final dataclasses).
_HANDLERS: dict[type, Callable[[RunState, Any], None]] = {
    ErrorEvent: RunState._on_error,
    WeightLoad: RunState._on_weight_load,
    KVCache: RunState._on_kv_cache,
    MemoryPoolEnd: RunState._on_pool_end,
    GraphCapture: RunState._on_graph_capture,
    GraphProgress: RunState._on_graph_progress,
    Capacity: RunState._on_capacity,
    PhaseChange: RunState._on_phase_change,
    DistInit: RunState._on_dist_init,
    ServerArgs: RunState._on_server_args,
    VllmMemoryProfile: RunState._on_vllm_memory,
    RunEnd: RunState._on_run_end,
    DeviceMap: RunState._on_device_map,
}
