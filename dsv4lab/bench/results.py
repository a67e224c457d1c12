"""The result of one benchmark run: summary, per-request table, provenance — one type for both backends.

A number in a report is only as good as what can be said about where it came from, so every result carries
its provenance (server config, engine and version from ``/server_info``, host, GPUs, client version,
workload and its seed, load) and a unique id; the store never overwrites a result. A run stopped by a
dying server is still a result: ``partial`` is set, ``abort_reason`` says why and ``diagnosis`` holds what
the caller's ``on_server_death`` hook found in the server log.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import platform
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from dsv4lab.atomicfile import to_jsonable
from dsv4lab.bench.metrics import Distribution, RequestRecord, Summary
from dsv4lab.config import AnyConfig
from dsv4lab.counts import plural
from dsv4lab.hosts import Host
from dsv4lab.resources import __version__
from dsv4lab.units import WALL_CLOCK, Clock, fmt_ms, fmt_s, fmt_tok_s

__all__ = [
    "BenchResult",
    "BenchRuns",
    "Provenance",
    "ServerContext",
    "client_version",
    "records_frame",
    "to_jsonable",
]

#: Columns of the per-request table, in order.
REQUEST_COLUMNS = (
    "index",
    "status",
    "scheduled_s",
    "start_s",
    "queue_ms",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "itl_ms",
    "prompt_tokens",
    "output_tokens",
    "prompt_tokens_from_server",
    "output_tokens_from_server",
    "http_status",
    "error",
)


#: The latency distributions every flat view shows, in ms.
_LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms")


def client_version() -> str:
    """The client's own versions, stored with every result: two runs are comparable only if the client that
    measured them is the same."""
    import aiohttp

    return f"dsv4lab {__version__} (python {platform.python_version()}, aiohttp {aiohttp.__version__})"


def _ms(x: float | None) -> float:
    return math.nan if x is None else x * 1000


def records_frame(records: Sequence[RequestRecord], *, itl_unit: str = "chunk") -> pd.DataFrame:
    """One row per request; ``itl_ms`` holds each request's inter-token latencies (chunk gaps, or per token
    with ``itl_unit="token"``; see :meth:`~dsv4lab.bench.metrics.RequestRecord.itls`)."""
    rows = [
        {
            "index": r.index,
            "status": r.status,
            "scheduled_s": r.scheduled_s,
            "start_s": math.nan if r.start_s is None else r.start_s,
            "queue_ms": _ms(r.queue_s),
            "ttft_ms": _ms(r.ttft_s),
            "tpot_ms": _ms(r.tpot_s),
            "e2e_ms": _ms(r.e2e_s),
            "itl_ms": [g * 1000 for g in r.itls(itl_unit)],
            "prompt_tokens": r.prompt_tokens,
            "output_tokens": r.output_tokens,
            "prompt_tokens_from_server": r.prompt_tokens_from_server,
            "output_tokens_from_server": r.output_tokens_from_server,
            "http_status": r.http_status,
            "error": r.error,
        }
        for r in records
    ]
    frame: pd.DataFrame = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    if any(r.text is not None for r in records):  # only with ClientOptions(record_text=True)
        frame["text"] = [r.text for r in records]
    return frame


@dataclass(frozen=True)
class ServerContext:
    """What the caller knows of the server a benchmark measures: the host it runs on and the config it was
    launched with (for the result's provenance), and its ``/server_info`` and GPU names (to skip asking)."""

    host: Host | None = None
    config: AnyConfig | None = None
    info: Mapping[str, Any] | None = None
    gpus: Sequence[str] | None = None
    #: Whether the server's process still runs (a launched server's ``is_alive``): polled during a run, so a
    #: dead server ends it even where its connections do not fail (a tunnel, a socket a child inherited).
    alive: Callable[[], bool] | None = None


@dataclass(frozen=True)
class Provenance:
    """Where a result came from."""

    url: str
    backend: str  # "dsv4lab" (built-in client) or the SGLang bench module that ran remotely
    api: str
    engine: str = "unknown"
    engine_version: str | None = None
    #: Which of the server's endpoints named the engine (``GET /server_info``, ``GET /version``, ...).
    engine_from: str | None = None
    host: str | None = None
    gpu_names: tuple[str, ...] = ()
    client: str = field(default_factory=client_version)
    workload: Mapping[str, Any] = field(default_factory=dict)
    load: Mapping[str, Any] = field(default_factory=dict)
    client_options: Mapping[str, Any] = field(default_factory=dict)
    config: Mapping[str, Any] | None = None
    server_info: Mapping[str, Any] = field(default_factory=dict)
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())

    @property
    def workload_seed(self) -> int | None:
        seed = self.workload.get("seed")
        return int(seed) if seed is not None else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = to_jsonable({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Provenance:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["gpu_names"] = tuple(kwargs.get("gpu_names") or ())
        return cls(**kwargs)


@dataclass(frozen=True, eq=False)
class BenchResult:
    """One run: ``summary``, ``requests`` (a DataFrame, one row per request) and ``provenance``."""

    summary: Summary
    requests: pd.DataFrame
    provenance: Provenance
    concurrency: int | None
    request_rate: float = math.inf
    repeat: int = 0
    label: str = ""
    partial: bool = False
    abort_reason: str | None = None
    diagnosis: Any = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: ``time.perf_counter()`` at the run's origin (request times count from it); same-host timing checks only.
    origin_perf_s: float | None = None
    #: The user stopped this run (Stop button, Ctrl-C); ``partial`` is set too.
    interrupted: bool = False
    #: With ``profile=True``: the server's answer to ``/stop_profile`` (SGLang names the trace there).
    profile: str | None = None
    #: Wall-clock seconds the client took over the measured requests, on this machine. Against a real server
    #: that is the run's duration; against the twin, whose figures come from its stamps, it is only how long
    #: the host took to compute the modelled run (:attr:`host_lag_s`).
    wall_duration_s: float | None = None

    @property
    def host_lag_s(self) -> float | None:
        """Against the twin: wall seconds the host took beyond what the twin's pace asked for (in virtual
        time, which asks for none, all of them); never part of a figure. None for a real server."""
        clock = self.clock
        if not clock.is_twin or self.wall_duration_s is None:
            return None
        return max(0.0, self.wall_duration_s - (clock.pace or 0.0) * self.summary.duration_s)

    @property
    def ttft_clock(self) -> str:
        """Where each request's clock started: ``send`` (request bytes written to an open connection) or
        ``connect`` (before encoding the body and opening a connection, as ``bench_serving`` does)."""
        value = self.provenance.client_options.get("ttft_clock")
        if isinstance(value, str):
            return value
        return "send" if self.provenance.backend == "dsv4lab" else "connect"

    @property
    def itl_unit(self) -> str:
        """``chunk`` (one gap per chunk) or ``token`` (each chunk's gap split over its tokens)."""
        value = self.provenance.client_options.get("itl_unit")
        return value if isinstance(value, str) else "chunk"

    @property
    def stamp_chunks(self) -> str:
        """``text`` (only chunks with text are timed) or ``choice`` (every chunk with a choice, as vLLM's client)."""
        value = self.provenance.client_options.get("stamp_chunks")
        return value if isinstance(value, str) else "text"

    @property
    def definitions(self) -> dict[str, str]:
        """The metric definitions this result follows, in words a report can quote."""
        start = (
            "before the request body was encoded and a new connection opened (bench_serving's clock)"
            if self.ttft_clock == "connect"
            else "when the request's bytes were written to an already open connection"
        )
        timed = "token-bearing" if self.stamp_chunks == "text" else "choice-bearing (text or not)"
        itl = (
            f"each gap between {timed} chunks split evenly over the tokens of the later chunk"
            if self.itl_unit == "token"
            else f"each gap between {timed} chunks"
        )
        end = "the last line of the stream" if self.provenance.backend != "dsv4lab" else f"the last {timed} chunk"
        return {
            "clock": start,
            "ttft": f"first {timed} chunk minus the request's start (see clock)",
            "e2e": f"{end} minus the request's start",
            "tpot": "(E2E - TTFT) / (output tokens - 1), per request with more than one output token",
            "itl": itl,
            "output_throughput": "output tokens of completed requests / benchmark duration",
        }

    @property
    def workload_text(self) -> str:
        """The workload in a reader's words (``"8,000 in / 256 out tokens per request"``), empty when the
        provenance does not say: a throughput means little without it."""
        w = self.provenance.workload
        if not w or w.get("mean_prompt_len") is None or w.get("mean_output_len") is None:
            return ""
        return f"{w['mean_prompt_len']:,.0f} in / {w['mean_output_len']:,.0f} out tokens per request"

    @property
    def clock(self) -> Clock:
        """How this run's measurements are read (see :mod:`dsv4lab.units`)."""
        return Clock.from_server_info(self.provenance.server_info)

    @property
    def outcome(self) -> str:
        """``ok``; ``errors`` (some requests failed); ``failed`` (none completed: the figures are not a
        measurement); ``partial`` (cut short by a dying server); ``stopped`` (by the user)."""
        if self.interrupted:
            return "stopped"
        if self.partial:
            return "partial"
        s = self.summary
        if s.completed == 0:
            return "failed"
        return "errors" if s.completed < s.total else "ok"

    @property
    def failure(self) -> str | None:
        """Why the requests that did not complete failed, in the server's words and most common first
        (``"8 of 8 requests: HTTP 400 (in the stream): Token id 19837 is out of vocabulary"``); None when all
        completed."""
        if self.summary.completed == self.summary.total:
            return None
        return failure_text(self.requests, self.summary.total)

    @property
    def prompts_text(self) -> str:
        """How the prompts were made (under the server's tokenizer, or why not), empty when not recorded."""
        prompts = (self.provenance.workload.get("params") or {}).get("prompts")
        if not isinstance(prompts, Mapping):
            return ""
        text = str(prompts.get("method") or "")
        vocab = prompts.get("vocab_size")
        if isinstance(vocab, int) and "token ids" in text:
            text += f" (vocabulary {vocab:,}, from {prompts.get('vocab_from')})"
        return text

    @property
    def on_hardware(self) -> Summary:
        """The summary a person reads: the modelled hardware's on the twin (from its stamps), the measured
        one on a real server; both are :attr:`summary`."""
        return self.summary

    def to_frame(self) -> pd.DataFrame:
        """One row of flat columns (the metrics a table or a chart wants), for ``pd.concat`` and plots.

        Every figure is on the reader's clock (the modelled hardware on the twin); ``clock`` says which, and
        on the twin ``host_lag_s`` how long this machine took beyond the pace.
        """
        frame: pd.DataFrame = pd.DataFrame([self.flat()])
        return frame

    def _headline(self, s: Summary | None = None) -> dict[str, Any]:
        """The counts and throughputs every flat view of a run leads with (the frame, the CLI's JSON), on
        the reader's clock unless ``s`` says otherwise."""
        s = self.on_hardware if s is None else s
        return {
            "completed": s.completed,
            "failed": s.failed,
            "incomplete": s.incomplete,
            "not_sent": s.not_sent,
            "duration_s": s.duration_s,
            "request_throughput": s.request_throughput,
            "input_throughput": s.input_throughput,
            "output_throughput": s.output_throughput,
            "peak_output_throughput": s.peak_output_throughput,
            "total_input_tokens": s.total_input_tokens,
            "total_output_tokens": s.total_output_tokens,
        }

    def flat(self) -> dict[str, Any]:
        """The row of :meth:`to_frame` as a dict."""
        s = self.on_hardware
        row: dict[str, Any] = {
            "label": self.label,
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "repeat": self.repeat,
            "partial": self.partial,
            "interrupted": self.interrupted,
            "outcome": self.outcome,
            "host_lag_s": self.host_lag_s,
            **self._headline(s),
        }
        for name in _LATENCIES:
            d: Distribution = getattr(s, name)
            for stat in ("mean", "median", "p90", "p99"):
                row[f"{name}_{stat}"] = getattr(d, stat)
        row["accept_length"] = s.accept_length
        row["ttft_clock"] = self.ttft_clock
        row["itl_unit"] = self.itl_unit
        row["stamp_chunks"] = self.stamp_chunks
        clock = self.clock
        row["clock"] = clock.reading
        row["clock_kind"] = clock.kind
        row["pace"] = clock.pace
        row.update(
            engine=self.provenance.engine,
            engine_version=self.provenance.engine_version,
            backend=self.provenance.backend,
            url=self.provenance.url,
            abort_reason=self.abort_reason,
            failure=self.failure,
            id=self.id,
        )
        return row

    # -- views ------------------------------------------------------------------------------------------

    def row(self) -> dict[str, Any]:
        """The compact per-run object the CLI prints with ``--json`` (one JSON line per concurrency), on the
        reader's clock; ``clock`` names it (``twin-virtual``, ``twin-paced`` or ``wall``)."""
        s = self.on_hardware

        def dist(d: Distribution) -> dict[str, Any]:
            return {k: v for k, v in d.to_dict().items() if k in ("mean", "median", "std", "p90", "p99", "count")}

        row: dict[str, Any] = to_jsonable(
            {
                "id": self.id,
                "label": self.label,
                "concurrency": self.concurrency,
                "request_rate": self.request_rate,
                "repeat": self.repeat,
                "partial": self.partial,
                "outcome": self.outcome,
                "failure": self.failure,
                "abort_reason": self.abort_reason,
                "diagnosis": self.diagnosis,
                "host_lag_s": self.host_lag_s,
                "wall_duration_s": self.wall_duration_s,
                **self._headline(),
                "output_tokens_from_server": s.output_tokens_from_server,
                "goodput": s.goodput,
                "ttft_clock": self.ttft_clock,
                "itl_unit": self.itl_unit,
                "stamp_chunks": self.stamp_chunks,
                "ttft_ms": dist(s.ttft_ms),
                "tpot_ms": dist(s.tpot_ms),
                "itl_ms": dist(s.itl_ms),
                "e2e_ms": dist(s.e2e_ms),
                "queue_ms": dist(s.queue_ms),
                "engine": self.provenance.engine,
                "engine_version": self.provenance.engine_version,
                "engine_from": self.provenance.engine_from,
                "backend": self.provenance.backend,
                "prompts": (self.provenance.workload.get("params") or {}).get("prompts"),
                "clock": self.clock.kind,
                "pace": self.clock.pace,
            }
        )
        return row

    def to_dict(self) -> dict[str, Any]:
        """Everything, JSON-safe: the store's line format (requests stored column-wise)."""
        frame = self.requests
        requests = {c: to_jsonable(frame[c].tolist()) for c in frame.columns}
        return {
            "id": self.id,
            "label": self.label,
            "concurrency": self.concurrency,
            "request_rate": None if math.isinf(self.request_rate) else self.request_rate,
            "repeat": self.repeat,
            "partial": self.partial,
            "abort_reason": self.abort_reason,
            "diagnosis": to_jsonable(self.diagnosis),
            "origin_perf_s": self.origin_perf_s,
            "interrupted": self.interrupted,
            "profile": self.profile,
            "wall_duration_s": self.wall_duration_s,
            "summary": self.summary.to_dict(),
            "provenance": self.provenance.to_dict(),
            "requests": requests,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BenchResult:
        rate = data.get("request_rate")
        frame = pd.DataFrame(dict(data.get("requests") or {}))
        for col in REQUEST_COLUMNS:
            if col not in frame.columns:
                frame[col] = pd.Series(dtype=object)
        return cls(
            summary=Summary.from_dict(dict(data["summary"])),
            requests=frame[list(REQUEST_COLUMNS) + [c for c in frame.columns if c not in REQUEST_COLUMNS]],
            provenance=Provenance.from_dict(dict(data.get("provenance") or {})),
            concurrency=data.get("concurrency"),
            request_rate=math.inf if rate is None else float(rate),
            repeat=int(data.get("repeat", 0)),
            label=str(data.get("label", "")),
            partial=bool(data.get("partial", False)),
            abort_reason=data.get("abort_reason"),
            diagnosis=data.get("diagnosis"),
            id=str(data["id"]),
            origin_perf_s=data.get("origin_perf_s"),
            interrupted=bool(data.get("interrupted", False)),
            profile=data.get("profile"),
            wall_duration_s=data.get("wall_duration_s"),
        )

    def __repr__(self) -> str:
        s = self.on_hardware
        flag = " PARTIAL" if self.partial else ""
        if self.outcome == "failed":
            return f"BenchResult({self.label or self.provenance.url} c={self.concurrency} FAILED: {self.failure})"
        return (
            f"BenchResult({self.label or self.provenance.url} c={self.concurrency}{flag}: {s.completed}/{s.total} ok, "
            f"{fmt_tok_s(s.output_throughput)} output{self.clock.tag}, TTFT median {fmt_ms(s.ttft_ms.median)}, "
            f"TPOT median {fmt_ms(s.tpot_ms.median)})"
        )

    def _repr_html_(self) -> str:
        return _result_html(self)


#: How many distinct reasons a failure text names.
_REASONS = 2


def _reason_key(error: str) -> str:
    """Errors that differ only in their numbers are one reason (``Token id 19837 is out of vocabulary``
    and ``Token id 19694 ...``); the HTTP status stays apart."""
    head = re.match(r"HTTP \d{3}(?: \(in the stream\))?: ", error)
    cut = head.end() if head else 0
    return error[:cut] + re.sub(r"\d+", "#", error[cut:])


def failure_text(frame: pd.DataFrame, total: int) -> str:
    """The errors of the requests in ``frame`` that did not complete, grouped: ``"N of M requests: reason"``
    for the most common ones, ``e.g.`` before the first of a group whose numbers vary (a run cut short adds
    ``run aborted (...)`` to each, which is kept)."""
    if "error" not in frame or not len(frame):
        return "no error recorded"
    failed = frame[frame["status"] != "ok"] if "status" in frame else frame
    errors = [str(e)[:300] for e in failed["error"] if isinstance(e, str) and e]
    if not errors:
        return "no error recorded"
    groups: dict[str, list[str]] = {}
    for e in errors:
        groups.setdefault(_reason_key(e), []).append(e)
    ranked = sorted(groups.values(), key=lambda g: -len(g))
    parts = [f"{len(g)} of {plural(total, 'request')}: {'' if len(set(g)) == 1 else 'e.g. '}{g[0]}" for g in ranked]
    parts = parts[:_REASONS]
    if len(ranked) > _REASONS:
        parts.append(f"{plural(len(ranked) - _REASONS, 'other reason')}")
    return "; ".join(parts)


def _result_html(r: BenchResult) -> str:
    from dsv4lab import htmlview as hv

    s, p, clock = r.on_hardware, r.provenance, r.clock
    where = f"{p.engine} {p.engine_version or ''}".strip()
    c = r.concurrency if r.concurrency is not None else "unlimited"
    rate = "" if math.isinf(r.request_rate) else f", {r.request_rate:g} req/s"
    head = hv.p(
        f"against {p.url} ({where}, {p.api} API, client {p.backend}); concurrency {c}{rate}, repeat {r.repeat}; "
        f"TTFT clock {r.ttft_clock}, ITL per {r.itl_unit}"
        + (", every chunk with a choice timed (text or not)" if r.stamp_chunks == "choice" else "")
    )
    warn = ""
    if r.partial:
        warn = hv.p(f"Partial result: {r.abort_reason or 'run aborted'}") + (
            hv.p(f"Diagnosis: {r.diagnosis}") if r.diagnosis is not None else ""
        )
    elif r.outcome == "failed":
        warn = hv.p(f"Failed: no request completed, so there is no measurement. {r.failure}")
    elif r.outcome == "errors":
        warn = hv.p(f"Failed requests: {r.failure}")
    if r.prompts_text:
        warn += hv.p(f"Prompts: {r.prompts_text}")
    tput: list[tuple[str, object]] = [
        ("requests", f"{s.completed} ok, {s.failed} failed, {s.incomplete} incomplete, {s.not_sent} not sent"),
        ("duration", fmt_s(s.duration_s)),
        ("output throughput", fmt_tok_s(s.output_throughput)),
    ]
    if r.host_lag_s is not None:
        tput.append((f"host lag ({WALL_CLOCK}, not in any figure)", fmt_s(r.host_lag_s)))
    tput += [
        ("request throughput", f"{hv.fmt(s.request_throughput, 3)} req/s"),
        ("input throughput", fmt_tok_s(s.input_throughput)),
    ]
    if s.accept_length is not None:
        tput.append(("speculative accept length", f"{hv.fmt(s.accept_length)} tokens per step"))
    if s.goodput is not None:
        tput.append(("goodput", f"{hv.fmt(s.goodput, 3)} req/s"))
    rows = [
        {
            "latency (ms)": name,
            "mean": d.mean,
            "median": d.median,
            "p90": d.p90,
            "p99": d.p99,
            "samples": d.count,
        }
        for name, d in (
            ("TTFT", s.ttft_ms),
            ("TPOT", s.tpot_ms),
            ("ITL", s.itl_ms),
            ("E2E", s.e2e_ms),
            ("queue", s.queue_ms),
        )
    ]
    note = hv.p(clock.note()) if clock.is_twin else ""
    state: hv.State = "fail" if r.partial or r.outcome == "failed" else "warn" if r.outcome == "errors" else "ok"
    status = "PARTIAL" if r.partial else fmt_tok_s(s.output_throughput) if s.completed else "✗ FAILED"
    figures = hv.kv_table(tput) + hv.table(rows, digits=1)
    if s.completed == 0:  # zeros and blanks are no measurement: the requests and why they failed say it all
        figures = hv.kv_table(tput[:2])
    return hv.card(f"benchmark {r.label}".strip(), head + warn + figures + note, state=state, status=status)


class BenchRuns(Sequence[BenchResult]):
    """Runs of one sweep or campaign step: a sequence of :class:`BenchResult` that tabulates and shows itself."""

    def __init__(self, runs: Sequence[BenchResult] = ()) -> None:
        self._runs: tuple[BenchResult, ...] = tuple(runs)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return BenchRuns(self._runs[index])
        return self._runs[index]

    def __len__(self) -> int:
        return len(self._runs)

    def __add__(self, other: Sequence[BenchResult]) -> BenchRuns:
        return BenchRuns((*self._runs, *other))

    @property
    def partial(self) -> bool:
        """Whether any run ended early (the server died or the user stopped it)."""
        return any(r.partial for r in self._runs)

    def to_frame(self) -> pd.DataFrame:
        """One row per run, flat metric columns (see :meth:`BenchResult.to_frame`)."""
        frame: pd.DataFrame = pd.DataFrame([r.flat() for r in self._runs])
        return frame

    def __repr__(self) -> str:
        return f"BenchRuns({plural(len(self), 'run')}" + (", partial" if self.partial else "") + ")"

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        if not self._runs:
            return hv.card("benchmark runs", hv.p("no runs"), state="info")
        clock = self._runs[0].clock
        workloads = {r.workload_text for r in self._runs}
        rows = []
        for r in self._runs:
            s = r.on_hardware
            row: dict[str, object] = {"label": r.label, "concurrency": r.concurrency, "repeat": r.repeat}
            if len(workloads) > 1:
                row["workload"] = r.workload_text or "–"
            row["output tok/s"] = s.output_throughput
            row.update(
                {
                    "TTFT median (ms)": s.ttft_ms.median,
                    "TPOT median (ms)": s.tpot_ms.median,
                    "requests ok": f"{s.completed}/{s.total}",
                    "status": _run_status(r),
                }
            )
            rows.append(row)
        note = hv.p(clock.note()) if clock.is_twin else ""
        if len(workloads) == 1 and (only := workloads.pop()):
            note = hv.p(f"workload: {only}") + note
        failed = [r for r in self._runs if r.outcome == "failed"]
        state: hv.State = "fail" if self.partial or failed else "ok"
        status = f"✗ {len(failed)} of {plural(len(self), 'run')} failed" if failed else ""
        return hv.card(plural(len(self), "benchmark run"), hv.table(rows, digits=1) + note, state=state, status=status)


def _run_status(r: BenchResult) -> str:
    """One word or phrase for a run's outcome, as every table shows it."""
    if r.interrupted:
        return "stopped: " + (r.abort_reason or "by the user")
    if r.partial:
        return "PARTIAL: " + (r.abort_reason or "")
    if r.summary.completed == 0:
        return f"FAILED: {r.failure}"
    if r.summary.failed or r.summary.incomplete:
        return f"ok, {r.summary.failed + r.summary.incomplete} failed"
    return "ok"
