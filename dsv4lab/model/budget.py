"""What the log says each GPU's memory went to, in the memory model's categories, beside the prediction.

:func:`dsv4lab.model.memory.preflight` predicts a split per GPU: weights, draft weights, KV pool, communication
buffers, CUDA-graph pools and what is left (or how much is missing). SGLang prints the same quantities as it
starts — ``mem usage`` of each weight load, ``avail mem`` before and after the KV pool, each capture's
``mem usage``, the OOM's tried / free / total — so :func:`observed_budget` reads them back into the same
categories and :func:`budget_frame` lays both out as one tidy table, which is what a "predicted vs observed"
chart and a check of the model need.

Some figures are logged by TP rank 0 only (the capture progress bar, 0.5.16+'s draft captures, the final
summary). Ranks are symmetric, so other ranks take rank 0's figure for those and say so in ``estimated``.
Communication buffers are read from the first capture: its progress bar already shows the free memory after
the buffers were registered and before the first graph was captured.

:func:`phases_from_log` gives the startup phases with wall-clock bounds from the log's timestamps (host local
time, second resolution unless ``SGLANG_LOG_MS=1``), and :func:`oom_point` the failed allocation, so that a
memory timeline sampled on the same host can show both.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import pandas as pd

from dsv4lab.config.hardware import HardwareProfile, hardware_profile
from dsv4lab.logs import (
    Capacity,
    ErrorEvent,
    ErrorKind,
    Event,
    GraphCapture,
    GraphProgress,
    KVCache,
    MemoryPoolEnd,
    OomFigures,
    PhaseChange,
    ServerArgs,
    WeightLoad,
    parse_log,
)
from dsv4lab.logs.source import LogSource
from dsv4lab.model.memory import GPUPrediction, Preflight

__all__ = [
    "ABS_TOLERANCE_GIB",
    "CATEGORIES",
    "REL_TOLERANCE",
    "ObservedBudget",
    "ObservedGPU",
    "OomPoint",
    "PhaseSpan",
    "budget_frame",
    "compare_budgets",
    "event_time",
    "log_events",
    "observed_budget",
    "oom_point",
    "phases_frame",
    "phases_from_log",
    "predicted_categories",
]

#: The split of one GPU, bottom of a stacked bar first. "other" is the CUDA context plus other processes;
#: "short" is memory that was needed beyond the card (predicted: the whole capture; observed: the failed
#: allocation beyond what was free).
CATEGORIES = ("other", "weights", "draft weights", "KV pool", "buffers", "graph pools", "free", "short")

#: How closely the memory model claims to predict each category: 2 % of the figure plus 0.1 GiB (the caching
#: allocator rounds every allocation up by up to ~1 %, logs round to 0.01 GiB). "free" carries the rounding
#: of everything allocated before it, so its 2 % is of the allocated total. Graph coefficients are
#: calibrated estimates: on hardware the model was not calibrated for, expect more (see dsv4lab.model.calibration).
REL_TOLERANCE = 0.02
#: The fixed part of that tolerance, in GiB (see :data:`REL_TOLERANCE`).
ABS_TOLERANCE_GIB = 0.1

_DRAFT_CLASS = re.compile(r"nextn|eagle|mtp|draft|medusa|dspark", re.I)
_MS_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d{1,6})?")


# -- timestamps ------------------------------------------------------------------------------------------------


def event_time(ev: Event, tz: _dt.tzinfo | None) -> pd.Timestamp | None:
    """The event's instant, tz-aware: its timestamp, with SGLANG_LOG_MS's milliseconds when the line has them.

    ``tz`` is the host's timezone (log timestamps are host-local); None means this machine's.
    """
    if ev.ts is None:
        return None
    frac = ""
    m = _MS_STAMP.match(ev.text) if ev.text else None
    if m is not None and m.group(1) == ev.ts[:19]:
        frac = m.group(2) or ""
    try:
        naive = _dt.datetime.strptime(ev.ts[:19], "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    if frac:
        naive += _dt.timedelta(seconds=float(frac))
    aware = naive.astimezone() if tz is None else naive.replace(tzinfo=tz)
    stamp: pd.Timestamp = pd.Timestamp(aware)
    return stamp


def log_events(log: LogSource | Iterable[Event]) -> list[Event]:
    """Parsed events of a log given as a path, a file, lines, or events already parsed."""
    if isinstance(log, (str, bytes)) or hasattr(log, "__fspath__") or hasattr(log, "read"):
        return list(parse_log(cast(LogSource, log)))
    items: list[Any] = list(cast(Iterable[Any], log))
    if all(isinstance(x, Event) for x in items):
        return cast(list[Event], items)
    return list(parse_log(cast(Iterable[str], items)))


# -- phases ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseSpan:
    """One startup (or serving) phase with wall-clock bounds, tz-aware."""

    name: str
    start: pd.Timestamp
    end: pd.Timestamp
    line_no: int

    @property
    def seconds(self) -> float:
        return float((self.end - self.start).total_seconds())


def _fatal(ev: Event) -> bool:
    return isinstance(ev, ErrorEvent) and ev.kind not in (ErrorKind.TEARDOWN,) and ev.complete


def phases_from_log(log: LogSource | Iterable[Event], *, tz: _dt.tzinfo | None = None) -> tuple[PhaseSpan, ...]:
    """Consecutive phases of the run: init, weights, KV pool, CUDA graphs, draft CUDA graphs, warmup,
    serving — or ``crash`` from the fatal error to the end of the log.

    The phases follow the lowest TP rank (the ranks move in lock-step and rank 0 logs everything);
    ``tz`` is the host's timezone (``GpuSampler.host_tz``), the local one when None.
    """
    events = log_events(log)
    ranks = [ev.rank for ev in events if isinstance(ev, (WeightLoad, GraphCapture)) and ev.rank is not None]
    lead = min(ranks) if ranks else None
    marks: list[tuple[str, pd.Timestamp, int]] = []
    last_time: pd.Timestamp | None = None
    seen_graph = False

    def mark(name: str, ev: Event) -> None:
        when = event_time(ev, tz)
        if when is not None and not (marks and marks[-1][0] == name):
            marks.append((name, when, ev.line_no))

    for ev in events:
        when = event_time(ev, tz)
        if when is not None and (last_time is None or when > last_time):
            last_time = when
        if marks and marks[-1][0] == "crash":
            continue  # teardown lines only extend the crash band
        if _fatal(ev):
            mark("crash", ev)
        elif isinstance(ev, ServerArgs):
            mark("init", ev)
        elif isinstance(ev, PhaseChange) and ev.ready:
            mark("serving", ev)
        elif isinstance(ev, PhaseChange) and ev.phase.value == "warmup":
            mark("warmup", ev)
        elif ev.rank != lead:
            continue
        elif isinstance(ev, WeightLoad) and ev.stage == "begin":
            if not marks:
                mark("init", ev)
            if not seen_graph and marks and marks[-1][0] == "KV pool":
                marks.pop()  # another load (0.5.16+: the draft's) comes before the KV pool after all
            mark("draft weights" if seen_graph else "weights", ev)
        elif isinstance(ev, WeightLoad) and ev.stage == "end":
            mark("draft KV pool" if seen_graph else "KV pool", ev)
        elif isinstance(ev, GraphCapture) and ev.stage == "begin":
            seen_graph = True
            mark("draft CUDA graph capture" if ev.is_draft else "CUDA graph capture", ev)
    spans: list[PhaseSpan] = []
    for i, (name, start, line_no) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else (last_time or start)
        spans.append(PhaseSpan(name, start, max(end, start), line_no))
    return tuple(spans)


def phases_frame(spans: Sequence[PhaseSpan]) -> pd.DataFrame:
    """The startup phases as a table (phase, start, end, seconds): what the memory timeline draws as bands."""
    frame: pd.DataFrame = pd.DataFrame(
        [{"phase": s.name, "start": s.start, "end": s.end, "seconds": s.seconds} for s in spans],
        columns=["phase", "start", "end", "seconds"],
    )
    return frame


# -- the OOM -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OomPoint:
    """The allocation that failed: when, on which GPU, and PyTorch's figures (GiB)."""

    time: pd.Timestamp | None
    gpu: int | None
    tried_gib: float | None
    free_gib: float | None
    total_gib: float | None
    phase: str | None
    line_no: int

    @property
    def used_gib(self) -> float | None:
        """What the GPU held when the allocation failed (total - free): the top of the spike."""
        if self.total_gib is None or self.free_gib is None:
            return None
        return self.total_gib - self.free_gib

    def label(self) -> str:
        """``OOM on GPU 1: tried 4.48 GiB, 0.15 GiB free`` (the parts the log had)."""
        where = f"OOM on GPU {self.gpu}" if self.gpu is not None else "OOM"
        parts = []
        if self.tried_gib is not None:
            parts.append(f"tried {self.tried_gib:.2f} GiB")
        if self.free_gib is not None:
            parts.append(f"{self.free_gib:.2f} GiB free")
        return f"{where}: {', '.join(parts)}" if parts else where


def oom_point(log: LogSource | Iterable[Event], *, tz: _dt.tzinfo | None = None) -> OomPoint | None:
    """The first CUDA OOM of the run (None when there was none)."""
    events = log_events(log)
    phase: str | None = None
    for ev in events:
        if isinstance(ev, GraphCapture) and ev.stage == "begin":
            phase = "draft CUDA graph capture" if ev.is_draft else "CUDA graph capture"
        elif isinstance(ev, MemoryPoolEnd) and phase is None:
            phase = "KV pool"
        if isinstance(ev, ErrorEvent) and ev.kind is ErrorKind.OOM:
            f = ev.oom
            gpu = f.gpu if f is not None and f.gpu is not None else ev.rank
            return OomPoint(
                event_time(ev, tz),
                gpu,
                f.tried_gib if f else None,
                f.free_gib if f else None,
                f.total_gib if f else None,
                phase,
                ev.line_no,
            )
    return None


# -- observed budget ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ObservedGPU:
    """One GPU's split as its rank logged it (GiB; None where the log does not say)."""

    gpu: int
    total_gib: float | None
    free_before_load_gib: float | None
    weights_gib: float | None
    draft_weights_gib: float
    kv_pool_gib: float | None
    kv_logged_gib: float | None  # the K/V sizes SGLang prints (without DSV4's per-request state)
    buffers_gib: float | None
    graphs_gib: float | None
    free_gib: float | None
    short_gib: float | None
    complete: bool  # the rank finished startup, so graphs and free are final
    estimated: tuple[str, ...] = ()

    @property
    def other_gib(self) -> float | None:
        if self.total_gib is None or self.free_before_load_gib is None:
            return None
        return max(0.0, self.total_gib - self.free_before_load_gib)

    def categories(self) -> dict[str, float | None]:
        return {
            "other": self.other_gib,
            "weights": self.weights_gib,
            "draft weights": self.draft_weights_gib,
            "KV pool": self.kv_pool_gib,
            "buffers": self.buffers_gib,
            "graph pools": self.graphs_gib,
            "free": self.free_gib,
            "short": self.short_gib,
        }


@dataclass(frozen=True)
class ObservedBudget:
    """Every GPU's logged split, and the OOM if there was one."""

    per_gpu: tuple[ObservedGPU, ...]
    oom: OomPoint | None
    ready: bool
    notes: tuple[str, ...] = field(default=())

    @property
    def failing_gpu(self) -> int | None:
        return self.oom.gpu if self.oom is not None else None

    def gpu(self, index: int) -> ObservedGPU:
        for g in self.per_gpu:
            if g.gpu == index:
                return g
        raise KeyError(f"GPU {index} is not in the log")


@dataclass
class _Rank:
    """What one TP rank's lines said, in the order SGLang prints them (GiB)."""

    first_avail: float | None = None
    weights: float | None = None
    draft: float = 0.0
    last_avail: float | None = None
    kv: float | None = None
    kv_logged: float | None = None
    capture_begin: float | None = None
    open_capture: str | None = None
    graphs: float = 0.0
    draft_graphs: float = 0.0
    roles_logged: set[str] = field(default_factory=set)
    free: float | None = None
    short: float | None = None
    total: float | None = None

    def avail(self, gib: float | None) -> None:
        """The free memory a line reports is what the next allocation is measured from."""
        if gib is not None:
            self.last_avail = gib

    def weight_load(self, ev: WeightLoad) -> None:
        if ev.stage == "begin" and self.first_avail is None:
            self.first_avail = ev.avail_gib
        elif ev.stage == "end" and ev.usage_gib is not None:
            # The second model loaded is the draft, whatever its class is called.
            if self.weights is not None or bool(ev.model_class and _DRAFT_CLASS.search(ev.model_class)):
                self.draft += ev.usage_gib
            else:
                self.weights = ev.usage_gib
        self.avail(ev.avail_gib)

    def kv_cache(self, ev: KVCache) -> None:
        if ev.size_gib is not None:
            self.kv_logged = (self.kv_logged or 0.0) + ev.size_gib

    def pool_end(self, ev: MemoryPoolEnd) -> None:
        if self.last_avail is not None and ev.avail_gib is not None:
            self.kv = (self.kv or 0.0) + max(0.0, self.last_avail - ev.avail_gib)
        self.avail(ev.avail_gib)

    def capture(self, ev: GraphCapture) -> None:
        if ev.stage == "begin":
            self.capture_begin = ev.avail_gib
            self.open_capture = ev.role
        elif ev.stage == "end":
            used = ev.usage_gib
            if used is None and self.capture_begin is not None and ev.avail_gib is not None:
                used = self.capture_begin - ev.avail_gib
            self.graphs += used or 0.0
            self.roles_logged.add(ev.role)
            if ev.role == "draft":
                self.draft_graphs += used or 0.0
            self.open_capture = None
        self.avail(ev.avail_gib)

    def oom(self, f: OomFigures) -> None:
        if f.total_gib is not None:
            self.total = f.total_gib
        if f.free_gib is not None:
            if self.open_capture is not None and self.capture_begin is not None:
                self.graphs += max(0.0, self.capture_begin - f.free_gib)  # the capture that failed, so far
            self.free = f.free_gib
            if f.tried_gib is not None:
                self.short = max(0.0, f.tried_gib - f.free_gib)


def _rank_of(ev: Event) -> int | None:
    """The TP rank a line belongs to: its tag; untagged memory lines are TP=1's rank 0; an untagged OOM names
    its GPU."""
    if ev.rank is not None:
        return ev.rank
    match ev:
        case WeightLoad() | KVCache() | MemoryPoolEnd() | GraphCapture() | Capacity():
            return 0
        case ErrorEvent(kind=ErrorKind.OOM, oom=OomFigures(gpu=gpu)) if gpu is not None:
            return gpu
    return None


@dataclass
class _BudgetReader:
    """The log read once, line by line: every rank's figures and what rank 0 alone logs."""

    ranks: dict[int, _Rank] = field(default_factory=dict)
    lead: int | None = None  # the lowest rank seen so far: the one that logs the progress bar and summary
    lead_first_capture: float | None = None
    buffers: float | None = None
    ready: bool = False
    capacity_avail: dict[int, float] = field(default_factory=dict)

    def add(self, ev: Event) -> None:
        match ev:
            case PhaseChange(ready=True):
                self.ready = True
                return
            case GraphProgress():
                self.progress(ev)
                return
        rank = _rank_of(ev)
        if rank is None:
            return
        r = self.ranks.setdefault(rank, _Rank())
        if self.lead is None or rank < self.lead:
            self.lead = rank
        match ev:
            case WeightLoad():
                r.weight_load(ev)
            case KVCache():
                r.kv_cache(ev)
            case MemoryPoolEnd():
                r.pool_end(ev)
            case GraphCapture():
                if ev.stage == "begin" and rank == self.lead and self.lead_first_capture is None:
                    self.lead_first_capture = ev.avail_gib
                r.capture(ev)
            case Capacity():
                if ev.available_gib is not None:
                    self.capacity_avail[rank] = ev.available_gib
            case ErrorEvent(kind=ErrorKind.OOM, oom=OomFigures() as figures):
                r.oom(figures)

    def progress(self, ev: GraphProgress) -> None:
        """The first capture's progress bar already shows the free memory after the buffers were registered."""
        if self.buffers is None and self.lead_first_capture is not None and ev.avail_gib is not None:
            self.buffers = max(0.0, self.lead_first_capture - ev.avail_gib)

    def gpu(self, index: int, oom: OomPoint | None, total: float | None, notes: list[str]) -> ObservedGPU:
        """One GPU's split; what its rank did not log is taken from rank 0 and marked estimated."""
        r = self.ranks[index]
        lead = self.ranks.get(self.lead) if self.lead is not None else None
        lead_draft = lead.draft_graphs if lead is not None else 0.0
        estimated: list[str] = []
        failed_here = oom is not None and oom.gpu == index
        graphs: float | None = r.graphs
        free = r.free
        complete = self.ready and not failed_here  # the rank finished startup: graphs and free are final
        if complete:
            if lead_draft and "draft" not in r.roles_logged:
                graphs = (graphs or 0.0) + lead_draft  # 0.5.16+: draft captures are logged by rank 0 only
                estimated.append("graph pools")
            free = self.capacity_avail.get(index)
            if free is None and r.last_avail is not None:
                free = r.last_avail - (lead_draft if "graph pools" in estimated else 0.0)
                if "graph pools" in estimated:
                    estimated.append("free")
        elif not failed_here:
            graphs = graphs if r.open_capture is None and graphs else None
            free = None
        buf = self.buffers
        if buf is not None and index != self.lead:
            estimated.append("buffers")
        if buf is not None and graphs is not None:
            graphs = max(0.0, graphs - buf)
        elif graphs is not None and buf is None:
            notes.append("communication buffers are not separable from graph pools in this log")
        return ObservedGPU(
            gpu=index,
            total_gib=r.total if r.total is not None else total,
            free_before_load_gib=r.first_avail,
            weights_gib=r.weights,
            draft_weights_gib=r.draft,
            kv_pool_gib=r.kv if r.kv is not None else r.kv_logged,
            kv_logged_gib=r.kv_logged,
            buffers_gib=buf,
            graphs_gib=graphs,
            free_gib=free,
            short_gib=r.short if failed_here else None,
            complete=complete,
            estimated=tuple(estimated),
        )


def _total_for(hardware: HardwareProfile | str | None, total_gib: float | None) -> float | None:
    if total_gib is not None:
        return total_gib
    if hardware is None:
        return None
    hw = hardware_profile(hardware) if isinstance(hardware, str) else hardware
    return hw.gpu.total_gib


def observed_budget(
    log: LogSource | Iterable[Event],
    *,
    hardware: HardwareProfile | str | None = None,
    total_gib: float | None = None,
) -> ObservedBudget:
    """Each GPU's memory split as the log tells it. ``hardware`` (or ``total_gib``) gives the card's capacity
    when the log does not (only an OOM message prints it)."""
    events = log_events(log)
    oom = oom_point(events)
    reader = _BudgetReader()
    for ev in events:
        reader.add(ev)
    total = _total_for(hardware, total_gib)
    if total is None and oom is not None:
        total = oom.total_gib
    notes: list[str] = []
    per_gpu = tuple(reader.gpu(index, oom, total, notes) for index in sorted(reader.ranks))
    return ObservedBudget(per_gpu, oom, reader.ready, tuple(dict.fromkeys(notes)))


# -- predicted, in the same categories ------------------------------------------------------------------------


def predicted_categories(p: Preflight, g: GPUPrediction, total_gib: float) -> dict[str, float]:
    """A preflight GPU as the chart's stack: demand beyond the card is the "short" segment on top."""
    short = g.short_by_gib if (g.short_by_gib is not None and not g.fits) else 0.0
    graphs = max(0.0, g.graphs_gib - short)
    return {
        "other": max(0.0, total_gib - g.free_before_load_gib),
        "weights": g.weights_gib,
        "draft weights": g.draft_weights_gib if p.settings.speculative is not None else 0.0,
        "KV pool": g.kv_pool_gib + g.draft_kv_gib,
        "buffers": g.comm_gib,
        "graph pools": graphs,
        "free": max(0.0, g.headroom_gib),
        "short": short,
    }


def _hardware_total(p: Preflight) -> float:
    return hardware_profile(p.hardware).gpu.total_gib


def budget_frame(
    predicted: Preflight | None = None,
    observed: ObservedBudget | None = None,
    *,
    config: str = "",
    gpus: Sequence[int] | None = None,
) -> pd.DataFrame:
    """Predicted and observed splits as one tidy table: ``config``, ``gpu``, ``source`` (predicted /
    observed), ``category`` (see :data:`CATEGORIES`), ``gib``, ``order``, ``estimated``, ``total_gib``.

    Concatenate the frames of several configs for a side-by-side chart.
    """
    rows: list[dict[str, Any]] = []
    if predicted is not None:
        total = _hardware_total(predicted)
        for g in predicted.per_gpu:
            if gpus is not None and g.gpu not in gpus:
                continue
            for cat, gib in predicted_categories(predicted, g, total).items():
                rows.append(_row(config, g.gpu, "predicted", cat, gib, False, total))
    if observed is not None:
        for o in observed.per_gpu:
            if gpus is not None and o.gpu not in gpus:
                continue
            for cat, value in o.categories().items():
                if value is None:
                    continue
                rows.append(_row(config, o.gpu, "observed", cat, value, cat in o.estimated, o.total_gib))
    frame: pd.DataFrame = pd.DataFrame(
        rows, columns=["config", "gpu", "source", "category", "gib", "order", "estimated", "total_gib"]
    )
    return frame


def _row(
    config: str, gpu: int, source: str, cat: str, gib: float, estimated: bool, total: float | None
) -> dict[str, Any]:
    return {
        "config": config,
        "gpu": gpu,
        "source": source,
        "category": cat,
        "gib": float(gib),
        "order": CATEGORIES.index(cat),
        "estimated": estimated,
        "total_gib": total,
    }


def compare_budgets(
    predicted: Preflight,
    observed: ObservedBudget,
    *,
    rel_tolerance: float = REL_TOLERANCE,
    abs_tolerance_gib: float = ABS_TOLERANCE_GIB,
) -> pd.DataFrame:
    """Per GPU and category: predicted, observed, difference, tolerance and ``agrees``.

    ``agrees`` is None where the two are not the same quantity: graph pools and free space on a GPU whose
    startup did not finish (capture stops at the failed allocation), and "short" (the model's is the whole
    capture's shortfall, the log's only the failed allocation's).
    """
    total = _hardware_total(predicted)
    rows: list[dict[str, Any]] = []
    by_gpu = {o.gpu: o for o in observed.per_gpu}
    for g in predicted.per_gpu:
        o = by_gpu.get(g.gpu)
        if o is None:
            continue
        pred = predicted_categories(predicted, g, total)
        if not g.fits:
            pred["graph pools"] = g.graphs_gib  # compare demand with demand, not the part that fits
        obs = o.categories()
        allocated = total - pred["free"]
        for cat in CATEGORIES:
            p, v = pred.get(cat), obs.get(cat)
            comparable = v is not None and p is not None and cat != "short"
            if cat in ("graph pools", "free") and not (o.complete and g.fits):
                comparable = False
            base = allocated if cat == "free" else max(abs(p or 0.0), abs(v or 0.0))
            tol = rel_tolerance * base + abs_tolerance_gib
            diff = (v - p) if (v is not None and p is not None) else None
            rows.append(
                {
                    "gpu": g.gpu,
                    "category": cat,
                    "predicted_gib": p,
                    "observed_gib": v,
                    "diff_gib": diff,
                    "tolerance_gib": tol,
                    "agrees": (abs(diff) <= tol) if comparable and diff is not None else None,
                    "estimated": cat in o.estimated,
                }
            )
    frame: pd.DataFrame = pd.DataFrame(rows)
    return frame
