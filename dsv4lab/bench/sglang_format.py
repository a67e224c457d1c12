"""Results in SGLang ``bench_serving``'s own formats, so its users can diff a dsv4lab run against theirs.

``bench_serving_record(result)`` is the object ``bench_serving --output-file`` appends per run: the same
keys with the same meanings (its ``--output-details`` lists too, with ``details=True``), and dsv4lab's own
figures under one extra key, ``"dsv4lab"`` (run id, failures by kind, client queue time, the metric
definitions the numbers follow). ``serving_block(result)`` is its printed ``Serving Benchmark Result``
block, which :func:`~dsv4lab.bench.remote.parse_stdout` reads back.

Where the two differ, the record says so rather than pretending: dsv4lab has no tokenizer, so
``total_output_tokens_retokenized`` is null; input tokens are the server's count (``usage``), where
``bench_serving`` sums its dataset's lengths; a client clock that is not ``bench_serving``'s (``ttft_clock``
``send``, the default) is named in ``dsv4lab.definitions``. The per-second peaks
(``max_output_tokens_per_s``, ``max_concurrent_requests``) are recomputed here the way ``bench_serving``
buckets them — a request counts in every second it touches, so its "peak concurrent requests" can exceed
the concurrency cap; dsv4lab's instantaneous peak is ``dsv4lab.peak_concurrent``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dsv4lab.atomicfile import to_jsonable
from dsv4lab.bench.metrics import SLO, Distribution
from dsv4lab.bench.results import BenchResult

__all__ = ["BACKEND_OF_API", "append_jsonl", "bench_serving_record", "serving_block"]

#: ``bench_serving --backend`` for each dsv4lab API (its sglang backends; vLLM's speak the same protocols).
BACKEND_OF_API = {"generate": "sglang", "completions": "sglang-oai", "chat": "sglang-oai-chat"}

#: bench_serving's ``--dataset-name`` for each dsv4lab workload kind.
_DATASET_OF_KIND = {"random": "random", "sharegpt": "sharegpt", "shared_prefix": "generated-shared-prefix"}


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else math.nan


def _rows(result: BenchResult) -> list[dict[str, Any]]:
    frame = result.requests
    return [{str(k): v for k, v in row.items()} for row in frame.to_dict("records")] if len(frame) else []


def _ok_rows(result: BenchResult) -> list[dict[str, Any]]:
    rows = _rows(result)
    return [r for r in rows if r.get("status") == "ok" and not math.isnan(_num(r.get("ttft_ms")))]


def _bucket_peaks(result: BenchResult) -> tuple[float, int]:
    """bench_serving's peak output tokens/s and peak concurrent requests: one-second buckets from the
    earliest request start; a token (or chunk, where token counts per chunk are unknown) counts at its
    arrival, a request in every second from its start to its end."""
    rows = [r for r in _ok_rows(result) if not math.isnan(_num(r.get("start_s")))]
    if not rows:
        return 0.0, 0
    first = min(float(r["start_s"]) for r in rows)
    ends = [float(r["start_s"]) + _num(r.get("e2e_ms")) / 1000 for r in rows]
    seconds = int(np.ceil(max(ends) - first)) + 1
    tokens = np.zeros(seconds)
    busy = np.zeros(seconds)
    for r, end in zip(rows, ends, strict=True):
        t = float(r["start_s"]) + float(r["ttft_ms"]) / 1000
        times = [t]
        for gap in r.get("itl_ms") or []:
            t += float(gap) / 1000
            times.append(t)
        for when in times:
            b = int(when - first)
            if 0 <= b < seconds:
                tokens[b] += 1
        for b in range(int(float(r["start_s"]) - first), min(int(end - first) + 1, seconds)):
            busy[b] += 1
    return float(tokens.max()), int(busy.max())


def _goodput(result: BenchResult, slo: SLO) -> dict[str, Any]:
    """bench_serving's goodput keys: the SLOs, good requests per second, and the share of requests sent
    that met every SLO and each one."""
    given = {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms, "e2el": slo.e2e_ms}
    slos = {k: float(v) for k, v in given.items() if v is not None}
    column = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}
    sent = max(1, result.summary.total - result.summary.not_sent)
    met = dict.fromkeys(slos, 0)
    good = 0
    for r in _ok_rows(result):
        ok = []
        for name, limit in slos.items():
            value = _num(r.get(column[name]))
            if name == "tpot" and math.isnan(value):
                value = 0.0  # a one-token answer has no TPOT; bench_serving counts it as 0
            if value <= limit:
                met[name] += 1
                ok.append(name)
        good += len(ok) == len(slos)
    duration = result.summary.duration_s
    return {
        "goodput_slos_ms": slos,
        "request_goodput": good / duration if duration > 0 else math.nan,
        "slo_attainment": good / sent,
        "slo_attainment_by_metric": {k: v / sent for k, v in met.items()},
    }


def _stats(prefix: str, d: Distribution) -> dict[str, float]:
    return {f"{stat}_{prefix}_ms": getattr(d, stat) for stat in ("mean", "median", "std", "p90", "p95", "p99")}


def bench_serving_record(result: BenchResult, *, details: bool = False, tag: str | None = None) -> dict[str, Any]:
    """``bench_serving``'s JSONL object for ``result`` (its ``--output-details`` lists with ``details``),
    plus dsv4lab's own figures under ``"dsv4lab"``."""
    s, p = result.summary, result.provenance
    params = dict(p.workload.get("params") or {})
    kind = params.get("kind")
    peak_tokens, peak_requests = _bucket_peaks(result)
    record: dict[str, Any] = {
        "tag": tag if tag is not None else (result.label or None),
        "backend": BACKEND_OF_API.get(p.api, p.api),
        "dataset_name": _DATASET_OF_KIND.get(str(kind), kind),
        "request_rate": result.request_rate,
        "max_concurrency": result.concurrency,
        "sharegpt_output_len": params.get("output_len") if kind == "sharegpt" else None,
        "random_input_len": params.get("input_len") if kind == "random" else None,
        "random_output_len": params.get("output_len") if kind == "random" else None,
        "random_range_ratio": params.get("range_ratio") if kind == "random" else None,
        "server_info": dict(p.server_info) or None,
        "duration": s.duration_s,
        "completed": s.completed,
        "total_input_tokens": s.total_input_tokens,
        "total_input_text_tokens": s.total_input_tokens,
        "total_input_vision_tokens": 0,
        "total_output_tokens": s.total_output_tokens,
        "total_output_tokens_retokenized": None,
        "request_throughput": s.request_throughput,
        "input_throughput": s.input_throughput,
        "output_throughput": s.output_throughput,
        "total_throughput": s.total_throughput,
        **_stats("e2e_latency", s.e2e_ms),
        **_stats("ttft", s.ttft_ms),
        **_stats("tpot", s.tpot_ms),
        **_stats("itl", s.itl_ms),
        "concurrency": s.concurrency,
        "accept_length": s.accept_length,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }
    if s.slo is not None:
        record.update(_goodput(result, s.slo))
    if details:
        record.update(_details(result))
    record["dsv4lab"] = to_jsonable(
        {
            "id": result.id,
            "label": result.label,
            "repeat": result.repeat,
            "partial": result.partial,
            "interrupted": result.interrupted,
            "abort_reason": result.abort_reason,
            "diagnosis": result.diagnosis,
            "total": s.total,
            "failed": s.failed,
            "incomplete": s.incomplete,
            "not_sent": s.not_sent,
            "ttft_clock": result.ttft_clock,
            "itl_unit": result.itl_unit,
            "definitions": result.definitions,
            "max_itl_ms": s.itl_ms.max,
            "queue_ms": s.queue_ms.to_dict(),
            "peak_concurrent": s.peak_concurrent,
            "peak_output_throughput": s.peak_output_throughput,
            "output_tokens_from_server": s.output_tokens_from_server,
            # bench_serving's own keys above hold what was measured, as bench_serving would record it
            # against this server (its readers and the parity check compare them); on the twin that is the
            # modelled hardware's clock, read from the twin's stamps, and this says so.
            "clock": result.clock.kind,
            "url": p.url,
            "engine": p.engine,
            "engine_version": p.engine_version,
            "client": p.client,
            "workload": dict(p.workload),
            "profile": result.profile,
        }
    )
    return record


def _details(result: BenchResult) -> dict[str, list[Any]]:
    """``--output-details``: per request, in order; failed requests as bench_serving writes them (0 tokens,
    TTFT 0, no gaps, the error)."""
    rows = _rows(result)
    has_text = "text" in result.requests.columns
    out: dict[str, list[Any]] = {k: [] for k in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts")}
    out["errors"] = []
    for r in rows:
        ok = r.get("status") == "ok"
        out["input_lens"].append(int(r.get("prompt_tokens") or 0))
        out["output_lens"].append(int(r.get("output_tokens") or 0) if ok else 0)
        out["ttfts"].append(_num(r.get("ttft_ms")) / 1000 if ok else 0.0)
        out["itls"].append([float(g) / 1000 for g in (r.get("itl_ms") or [])] if ok else [])
        text = r.get("text") if has_text else None
        out["generated_texts"].append(text if isinstance(text, str) else "")
        out["errors"].append("" if ok else str(r.get("error") or r.get("status")))
    return out


def append_jsonl(path: str | os.PathLike[str], records: Sequence[Mapping[str, Any]]) -> None:
    """Append records as JSON lines, the way bench_serving writes its ``--output-file`` (``Infinity`` for
    an unlimited request rate, NaN for a statistic with no samples), so its readers read ours."""
    from dsv4lab.secrets import collect_secrets, redact_data

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    known = collect_secrets()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # results are private to the user
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(redact_data(dict(record), known)) + "\n")


def _line(label: str, value: object, fmt: str = "") -> str:
    text = format(value, fmt) if fmt and isinstance(value, (int, float)) else str(value)
    return f"{label:<40} {text:<10}"


def serving_block(result: BenchResult) -> str:
    """bench_serving's printed result block (0.5.23 labels, two decimals) for ``result``."""
    s, p = result.summary, result.provenance
    rate: object = result.request_rate
    peak_tokens, peak_requests = _bucket_peaks(result)
    lines = [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        _line("Backend:", BACKEND_OF_API.get(p.api, p.api)),
        _line("Traffic request rate:", rate),
        _line("Max request concurrency:", result.concurrency if result.concurrency is not None else "not set"),
        _line("Successful requests:", s.completed),
        _line("Benchmark duration (s):", s.duration_s, ".2f"),
        _line("Total input tokens:", s.total_input_tokens),
        _line("Total input text tokens:", s.total_input_tokens),
        _line("Total generated tokens:", s.total_output_tokens),
        _line("Request throughput (req/s):", s.request_throughput, ".2f"),
        _line("Input token throughput (tok/s):", s.input_throughput, ".2f"),
        _line("Output token throughput (tok/s):", s.output_throughput, ".2f"),
        _line("Peak output token throughput (tok/s):", peak_tokens, ".2f"),
        _line("Peak concurrent requests:", peak_requests),
        _line("Total token throughput (tok/s):", s.total_throughput, ".2f"),
        _line("Concurrency:", s.concurrency, ".2f"),
    ]
    if s.accept_length:
        lines.append(_line("Accept length:", s.accept_length, ".2f"))
    sections = (
        ("End-to-End Latency", "E2E Latency", s.e2e_ms, ("Mean", "Median", "P90", "P95", "P99")),
        ("Time to First Token", "TTFT", s.ttft_ms, ("Mean", "Median", "P90", "P95", "P99")),
        ("Time per Output Token (excl. 1st token)", "TPOT", s.tpot_ms, ("Mean", "Median", "P90", "P95", "P99")),
        ("Inter-Token Latency", "ITL", s.itl_ms, ("Mean", "Median", "P90", "P95", "P99", "Max")),
    )
    for title, name, dist, stats in sections:
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        for stat in stats:
            value = getattr(dist, stat.lower())
            lines.append(_line(f"{stat} {name} (ms):", 0.0 if math.isnan(value) else value, ".2f"))
    lines.append("=" * 50)
    lines.append(f"(dsv4lab: TTFT clock {result.ttft_clock}, ITL per {result.itl_unit}; see --help)")
    return "\n".join(lines)
