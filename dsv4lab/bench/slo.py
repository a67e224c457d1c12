"""Latency SLOs on percentiles (``tpot_p99_ms=400``), whether a run meets them, and its goodput under them.

An SLO as the field writes it bounds a percentile of a latency over a run: "p99 TPOT at most 400 ms". A run
meets its SLOs when every bounded percentile is within its limit; its **goodput** counts the requests that
met every limit on their own (a request's TTFT, TPOT and end-to-end latency; for ITL, that percentile of its
own gaps) per second. Every figure is on the reader's clock (the modelled hardware on the twin), as the run's
tables are. The bench client's own goodput (:class:`~dsv4lab.bench.metrics.SLO`, bench_serving's
``--goodput``) takes per-request thresholds; these limits give the same count for TTFT, TPOT and E2E.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dsv4lab.bench.results import BenchResult
from dsv4lab.errors import ConfigError

__all__ = ["LATENCIES", "STATISTICS", "LatencyLimit", "good_requests", "goodput", "parse_slo", "slo_figures"]

#: The latencies an SLO can bound.
LATENCIES = ("ttft", "tpot", "itl", "e2e")
#: The statistics of a run's latencies an SLO can bound.
STATISTICS = ("mean", "median", "p90", "p95", "p99")
_NAME = re.compile(r"^(ttft|tpot|itl|e2e)_(mean|median|p90|p95|p99)_ms$")
_ALLOWED = "NAME=MS with NAME one of {ttft,tpot,itl,e2e}_{mean,median,p90,p95,p99}_ms and MS > 0, e.g. tpot_p99_ms=400"


@dataclass(frozen=True)
class LatencyLimit:
    """One SLO: a statistic of one latency over a run, at most ``limit_ms``."""

    latency: str
    statistic: str
    limit_ms: float

    @property
    def name(self) -> str:
        """As it is written on the command line and in tables: ``tpot_p99_ms``."""
        return f"{self.latency}_{self.statistic}_ms"

    def __str__(self) -> str:
        return f"{self.latency.upper()} {self.statistic} ≤ {self.limit_ms:g} ms"

    def value(self, result: BenchResult) -> float:
        """The run's value of the bounded statistic, in ms on the reader's clock (NaN when nothing measured)."""
        dist = getattr(result.on_hardware, f"{self.latency}_ms")
        return float(getattr(dist, self.statistic))

    def met_by(self, result: BenchResult) -> bool:
        value = self.value(result)
        return not math.isnan(value) and value <= self.limit_ms

    def request_ms(self, row: Mapping[str, Any]) -> float:
        """One request's own value of this latency (ms on the reader's clock: a twin's records are its stamps)."""
        if self.latency == "itl":
            gaps = [g for g in (row.get("itl_ms") or []) if g is not None]
            if not gaps:
                return math.nan
            if self.statistic == "mean":
                own = float(np.mean(gaps))
            elif self.statistic == "median":
                own = float(np.median(gaps))
            else:
                own = float(np.percentile(gaps, float(self.statistic[1:])))
            return own
        value = row.get(f"{self.latency}_ms")
        return math.nan if value is None else float(value)


def parse_slo(spec: Mapping[str, Any] | Sequence[str] | str | None) -> tuple[LatencyLimit, ...]:
    """SLOs from ``{"tpot_p99_ms": 400}``, ``["tpot_p99_ms=400", ...]``, ``"tpot_p99_ms=400,ttft_p90_ms=2000"`` or
    a notebook parameter's ``"tpot_p99_ms 400; ttft_p90_ms 2000"`` (papermill cannot read a parameter whose
    value holds an equals sign); a name or a limit that is not one is a :class:`ConfigError` naming it and
    what is allowed."""
    if spec is None or spec == "" or spec == ():
        return ()
    items: Iterable[tuple[str, Any]]
    if isinstance(spec, Mapping):
        items = spec.items()
    else:
        texts = re.split(r"[;,]", spec) if isinstance(spec, str) else list(spec)
        pairs = []
        for text in texts:
            if isinstance(text, str) and not text.strip():
                continue
            words = text.replace("=", " ").split() if isinstance(text, str) else []
            if len(words) != 2:
                raise ConfigError("slo", text, _ALLOWED)
            pairs.append((words[0], words[1]))
        items = pairs
    limits: dict[str, LatencyLimit] = {}
    for key, value in items:
        match = _NAME.match(str(key))
        if match is None:
            raise ConfigError("slo", key, _ALLOWED)
        try:
            limit = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"slo {key}", value, "a number of milliseconds > 0") from None
        if isinstance(value, bool) or not (0 < limit < math.inf):
            raise ConfigError(f"slo {key}", value, "a number of milliseconds > 0")
        if key in limits:
            raise ConfigError(f"slo {key}", value, f"one limit per SLO ({key} is also {limits[key].limit_ms:g})")
        limits[str(key)] = LatencyLimit(match.group(1), match.group(2), limit)
    return tuple(limits.values())


def good_requests(result: BenchResult, limits: Sequence[LatencyLimit]) -> int:
    """Requests that completed and met every limit on their own."""
    good = 0
    rows: list[dict[str, Any]] = result.requests.to_dict("records")  # type: ignore[assignment]
    for row in rows:
        if row.get("status") != "ok":
            continue
        values = [(limit, limit.request_ms(row)) for limit in limits]
        if all(not math.isnan(v) and v <= limit.limit_ms for limit, v in values):
            good += 1
    return good


def goodput(result: BenchResult, limits: Sequence[LatencyLimit]) -> float:
    """Requests per second (on the reader's clock) that met every limit; the run's request rate with no SLO."""
    duration = result.on_hardware.duration_s
    if not duration or duration <= 0 or math.isnan(duration):
        return 0.0
    return float(good_requests(result, limits) / duration)


def slo_figures(result: BenchResult, limits: Sequence[LatencyLimit]) -> dict[str, Any]:
    """What a table shows of a run under its SLOs: each bounded value, whether all are met, the good requests
    and the goodput (``goodput_req_s``)."""
    figures: dict[str, Any] = {limit.name: limit.value(result) for limit in limits}
    figures["meets_slo"] = all(limit.met_by(result) for limit in limits)
    figures["good_requests"] = good_requests(result, limits)
    figures["goodput_req_s"] = goodput(result, limits)
    return figures
