"""Per-request records and the metrics computed from them, as SGLang's ``bench_serving`` defines them.

Definitions (all latencies in ms in the summary; a request's clock starts when it is *sent* — by default when
its bytes are written to an open connection; with ``ClientOptions(ttft_clock="connect")`` before its body is
encoded and a new connection opened, as SGLang's ``bench_serving`` does, see :mod:`.client`):

* **TTFT** — first chunk carrying generated text, minus the send time.
* **E2E latency** — last chunk carrying generated text, minus the send time (a trailing usage-only chunk
  or ``[DONE]`` does not extend it).
* **TPOT** — per request ``(E2E − TTFT) / (output_tokens − 1)``, only for requests with more than one
  output token; then aggregated over requests.
* **ITL** — every gap between consecutive text-bearing chunks of a request, pooled over requests. It is a
  *chunk* gap: with speculative decoding a chunk may carry several tokens, which TPOT amortises and ITL
  does not. With ``itl_unit="token"`` each gap is split evenly over the tokens of the chunk that ended it (one
  value per token), which is ``bench_serving``'s ITL on ``/generate``; it needs per-chunk token counts,
  which only ``/generate`` reports (``meta_info.completion_tokens``), so elsewhere it is the chunk gap.
* **Queue** — send time minus scheduled time: how long a request waited for a free concurrency slot. It
  is not in TTFT/E2E (as in SGLang) but is reported beside them, so a client-side backlog is visible
  rather than silently omitted.
* **Throughputs** — completed requests, their prompt tokens and their output tokens, each divided by the
  benchmark duration (first scheduled send to the last response); **peak output tok/s** is the busiest
  1-second bucket, with a chunk's tokens placed at its arrival; **concurrency** is ΣE2E / duration
  (Little's law); **peak concurrent** the most requests in flight at once.
* **Goodput** — completed requests meeting *every* given SLO, per second.

Statistics are numpy's: mean, median, population std, linear-interpolated percentiles. Failed, incomplete
and never-sent requests are counted in the summary and kept in the per-request table, but are not part of
the latency distributions or throughputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

__all__ = [
    "SLO",
    "Distribution",
    "RequestRecord",
    "Status",
    "Summary",
    "summarize",
]

#: How one request ended: answered in full, refused or errored, cut off mid-stream, or never sent (the run
#: ended first); only ``ok`` requests count in the latency figures.
Status = Literal["ok", "failed", "incomplete", "not_sent"]


@dataclass(frozen=True)
class RequestRecord:
    """What the client saw of one request. Times are seconds; ``scheduled_s``/``start_s`` count from the
    run's origin, every other time from ``start_s``.

    ``status``: ``ok`` (the stream ended properly), ``failed`` (an HTTP error, an error event, or a
    connection error before any output), ``incomplete`` (output started but the stream broke off or the run
    was aborted), ``not_sent`` (the run stopped before its turn). Token counts say where they come from:
    the server's ``usage`` (or ``meta_info``), else the fallback — the workload's prompt length and the
    number of text-bearing chunks.
    """

    index: int
    status: Status
    scheduled_s: float
    start_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    end_s: float | None = None
    chunk_times_s: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    prompt_tokens_from_server: bool = False
    output_tokens_from_server: bool = False
    error: str = ""
    http_status: int | None = None
    text: str | None = None

    @property
    def queue_s(self) -> float | None:
        return None if self.start_s is None else max(0.0, self.start_s - self.scheduled_s)

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_tokens <= 1:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> tuple[float, ...]:
        t = self.chunk_times_s
        return tuple(t[i] - t[i - 1] for i in range(1, len(t)))

    def itls(self, unit: str = "chunk") -> tuple[float, ...]:
        """Inter-token latencies by definition: ``chunk`` gaps, or ``token`` (each gap split evenly over
        the tokens of the chunk that ended it, when the server reported per-chunk counts)."""
        gaps = self.itl_s
        tokens = self.chunk_tokens
        if unit != "token" or tokens is None or len(tokens) != len(self.chunk_times_s):
            return gaps
        out: list[float] = []
        for gap, k in zip(gaps, tokens[1:], strict=True):
            n = max(1, k)
            out.extend([gap / n] * n)
        return tuple(out)


_STATS = ("mean", "median", "std", "p90", "p95", "p99", "min", "max")


@dataclass(frozen=True)
class Distribution:
    """Summary statistics of one metric (NaN with ``count`` 0 when nothing was measured)."""

    count: int
    mean: float
    median: float
    std: float
    p90: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Distribution:
        arr = np.asarray(list(values), dtype=float)
        if arr.size == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, nan, nan, nan, nan, nan)
        p90, p95, p99 = (float(x) for x in np.percentile(arr, [90, 95, 99]))
        return cls(
            int(arr.size),
            float(arr.mean()),
            float(np.median(arr)),
            float(arr.std()),
            p90,
            p95,
            p99,
            float(arr.min()),
            float(arr.max()),
        )

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, **{k: _json_float(getattr(self, k)) for k in _STATS}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Distribution:
        return cls(int(data.get("count", 0)), *(_float(data.get(k)) for k in _STATS))


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput, in ms; an unset objective is not checked."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        if r.status != "ok" or r.ttft_s is None or r.e2e_s is None:
            return False
        if self.ttft_ms is not None and r.ttft_s * 1000 > self.ttft_ms:
            return False
        tpot = r.tpot_s
        if self.tpot_ms is not None and tpot is not None and tpot * 1000 > self.tpot_ms:
            return False
        return not (self.e2e_ms is not None and r.e2e_s * 1000 > self.e2e_ms)

    def to_dict(self) -> dict[str, float | None]:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


@dataclass(frozen=True)
class Summary:
    """The aggregate numbers of one run (one concurrency level, one repeat)."""

    total: int
    completed: int
    failed: int
    incomplete: int
    not_sent: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    peak_output_throughput: float
    concurrency: float
    peak_concurrent: int
    ttft_ms: Distribution
    tpot_ms: Distribution
    itl_ms: Distribution
    e2e_ms: Distribution
    queue_ms: Distribution
    output_tokens_from_server: bool
    goodput: float | None = None
    good_requests: int | None = None
    slo: SLO | None = None
    accept_length: float | None = None

    def _repr_html_(self) -> str:
        from dsv4lab import htmlview as hv

        facts: list[tuple[str, object]] = [
            (
                "requests",
                f"{self.completed} ok, {self.failed} failed, {self.incomplete} incomplete, {self.not_sent} not sent",
            ),
            ("duration s", self.duration_s),
            ("output tok/s", self.output_throughput),
            ("request/s", self.request_throughput),
        ]
        rows = [
            {"ms": name, "mean": d.mean, "median": d.median, "p90": d.p90, "p99": d.p99, "n": d.count}
            for name, d in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("ITL", self.itl_ms), ("E2E", self.e2e_ms))
        ]
        return hv.card("benchmark summary", hv.kv_table(facts) + hv.table(rows))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (Distribution, SLO)):
                out[f.name] = value.to_dict()
            elif isinstance(value, float):
                out[f.name] = _json_float(value)
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Summary:
        kwargs: dict[str, Any] = {}
        for f in fields(cls):
            value = data.get(f.name)
            if f.name.endswith("_ms"):
                kwargs[f.name] = Distribution.from_dict(value or {})
            elif f.name == "slo":
                kwargs[f.name] = SLO(**value) if value else None
            elif f.name in ("goodput", "accept_length"):
                kwargs[f.name] = None if value is None else float(value)
            elif f.name == "good_requests":
                kwargs[f.name] = None if value is None else int(value)
            elif f.name == "output_tokens_from_server":
                kwargs[f.name] = bool(value)
            elif f.type in ("int",):
                kwargs[f.name] = int(value or 0)
            else:
                kwargs[f.name] = _float(value)
        return cls(**kwargs)


def _json_float(x: float) -> float | None:
    """JSON has no NaN: an unmeasured statistic is written as null."""
    return None if math.isnan(x) else x


def _float(x: Any) -> float:
    return math.nan if x is None else float(x)


def _peak_output_throughput(ok: Sequence[RequestRecord]) -> float:
    """Tokens of the busiest 1-second bucket; a chunk's tokens count at its arrival time."""
    buckets: dict[int, float] = {}
    for r in ok:
        if r.start_s is None or not r.chunk_times_s:
            continue
        n = len(r.chunk_times_s)
        if r.chunk_tokens is not None and len(r.chunk_tokens) == n:
            weights: Sequence[float] = r.chunk_tokens
        else:
            weights = [r.output_tokens / n] * n
        for t, w in zip(r.chunk_times_s, weights, strict=True):
            b = math.floor(r.start_s + t)
            buckets[b] = buckets.get(b, 0.0) + w
    return max(buckets.values(), default=0.0)


def _peak_concurrent(records: Sequence[RequestRecord]) -> int:
    """Most requests in flight at once: a sweep over [start, end) intervals."""
    edges: list[tuple[float, int]] = []
    for r in records:
        if r.start_s is None:
            continue
        end = r.end_s if r.end_s is not None else r.e2e_s
        if end is None:
            continue
        edges.append((r.start_s, 1))
        edges.append((r.start_s + end, -1))
    edges.sort(key=lambda e: (e[0], e[1]))  # an end and a start at the same instant do not overlap
    best = cur = 0
    for _, step in edges:
        cur += step
        best = max(best, cur)
    return best


def summarize(
    records: Sequence[RequestRecord],
    duration_s: float,
    *,
    slo: SLO | None = None,
    accept_length: float | None = None,
    itl_unit: str = "chunk",
) -> Summary:
    """Aggregate ``records`` of one run lasting ``duration_s`` seconds (``itl_unit``: see
    :meth:`RequestRecord.itls`)."""
    ok = [r for r in records if r.status == "ok"]
    counts = {s: sum(1 for r in records if r.status == s) for s in ("failed", "incomplete", "not_sent")}
    dur = duration_s if duration_s > 0 else math.nan
    in_tok = sum(r.prompt_tokens for r in ok)
    out_tok = sum(r.output_tokens for r in ok)
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    good: int | None = None
    if slo is not None:
        good = sum(1 for r in ok if slo.met_by(r))
    return Summary(
        total=len(records),
        completed=len(ok),
        failed=counts["failed"],
        incomplete=counts["incomplete"],
        not_sent=counts["not_sent"],
        duration_s=duration_s,
        total_input_tokens=in_tok,
        total_output_tokens=out_tok,
        request_throughput=len(ok) / dur,
        input_throughput=in_tok / dur,
        output_throughput=out_tok / dur,
        total_throughput=(in_tok + out_tok) / dur,
        peak_output_throughput=_peak_output_throughput(ok),
        concurrency=sum(e2e) / dur,
        peak_concurrent=_peak_concurrent(records),
        ttft_ms=Distribution.of(r.ttft_s * 1000 for r in ok if r.ttft_s is not None),
        tpot_ms=Distribution.of(t * 1000 for r in ok if (t := r.tpot_s) is not None),
        itl_ms=Distribution.of(g * 1000 for r in ok for g in r.itls(itl_unit)),
        e2e_ms=Distribution.of(x * 1000 for x in e2e),
        queue_ms=Distribution.of(q * 1000 for r in records if (q := r.queue_s) is not None),
        output_tokens_from_server=bool(ok) and all(r.output_tokens_from_server for r in ok),
        goodput=None if good is None else good / dur,
        good_requests=good,
        slo=slo,
        accept_length=accept_length,
    )
