"""Every chart: a Vega-Lite spec that validates, data inline and small, SVG rendered with no network, and the
things a reader needs (title naming the subject, units on the axes, the markers). Structure, never pixels."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np
import pandas as pd
import pytest
import vl_convert as vlc

from dsv4lab import plots
from dsv4lab.bench import BenchResult, Provenance, RequestRecord, compare, summarize
from dsv4lab.bench.results import records_frame
from dsv4lab.config.presets import config_a, config_b, config_b_fixed
from dsv4lab.errors import PlotError
from dsv4lab.model.budget import OomPoint, PhaseSpan, observed_budget
from dsv4lab.model.memory import preflight
from dsv4lab.model.roofline import decode_roofline
from dsv4lab.serving.profiling import kernel_breakdown
from dsv4lab.units import Clock

DATA = Path(__file__).parent / "data" / "logs"
UTC = dt.timezone.utc
T0 = pd.Timestamp("2026-05-04 10:00:00", tz=UTC)


# -- helpers -------------------------------------------------------------------------------------------------------


def _spec(chart: Any) -> dict[str, Any]:
    return plots.to_spec(chart)  # validates against the Vega-Lite schema


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _datasets(spec: dict[str, Any]) -> dict[str, list[Any]]:
    return dict(spec.get("datasets", {}))


def _titles(spec: dict[str, Any]) -> list[str]:
    out = []
    for d in _walk(spec):
        t = d.get("title")
        if isinstance(t, str):
            out.append(t)
        elif isinstance(t, list):
            out.extend(str(x) for x in t)
        elif isinstance(t, dict):
            for key in ("text", "subtitle"):
                v = t.get(key)
                out.extend([v] if isinstance(v, str) else [str(x) for x in v or []])
    return out


def _axis_titles(spec: dict[str, Any]) -> list[str]:
    out = []
    for d in _walk(spec):
        for channel in ("x", "y"):
            enc = d.get(channel)
            if isinstance(enc, dict) and isinstance(enc.get("title"), str):
                out.append(enc["title"])
    return out


def _texts(spec: dict[str, Any]) -> list[str]:
    """Every string value in the embedded data (labels the chart prints)."""
    return [str(v) for rows in _datasets(spec).values() for row in rows for v in row.values() if isinstance(v, str)]


def _check(chart: Any, *, max_rows: int = 5000) -> tuple[dict[str, Any], str]:
    spec = _spec(chart)
    for d in _walk(spec):
        data = d.get("data")
        assert not (isinstance(data, dict) and "url" in data), "data must be inline"
    assert "$schema" in spec and "vega-lite" in spec["$schema"]
    for name, rows in _datasets(spec).items():
        assert len(rows) <= max_rows, f"{name} has {len(rows)} rows"
    svg = vlc.vegalite_to_svg(spec, allowed_base_urls=[])
    assert svg.lstrip().startswith("<svg") and "<script" not in svg
    assert 'href="http' not in svg
    return spec, svg


# -- data ------------------------------------------------------------------------------------------------------------


def _samples(hours: float = 0.0, hz: float = 2.0, spike_gpu: int = 1) -> pd.DataFrame:
    """A sampler frame: 8 GPUs climbing through weights, KV and graphs, one spiking to the card's top."""
    duration = hours * 3600 if hours else 30.0
    t = np.arange(0, duration, 1 / hz)
    rows = []
    for gpu in range(8):
        used = np.interp(
            t, [0, duration * 0.2, duration * 0.5, duration * 0.6, duration], [300, 20_000, 68_000, 80_000, 80_000]
        )
        if gpu == spike_gpu:
            i = len(t) * 2 // 3
            used = used.copy()
            used[i] = 97_700  # one sample at the top: the OOM
        for ti, u in zip(t, used, strict=True):
            rows.append((T0 + pd.Timedelta(seconds=float(ti)), float(ti), gpu, float(u), 97_887.0, 0.0))
    frame: pd.DataFrame = pd.DataFrame(rows, columns=["time", "t", "gpu", "used_mib", "total_mib", "util_pct"])
    frame.attrs["interval_ms"] = int(1000 / hz)
    return frame


def _phases(duration: float = 30.0) -> tuple[PhaseSpan, ...]:
    cuts = [("init", 0.0), ("weights", 0.05), ("KV pool", 0.5), ("CUDA graph capture", 0.55), ("crash", 0.667)]
    out = []
    for i, (name, f) in enumerate(cuts):
        end = cuts[i + 1][1] if i + 1 < len(cuts) else 0.7
        out.append(
            PhaseSpan(name, T0 + pd.Timedelta(seconds=f * duration), T0 + pd.Timedelta(seconds=end * duration), i)
        )
    return tuple(out)


def _oom(duration: float = 30.0) -> OomPoint:
    return OomPoint(T0 + pd.Timedelta(seconds=duration * 2 / 3), 1, 4.48, 0.15, 95.59, "CUDA graph capture", 1)


def _result(
    label: str, concurrency: int, tok_s: float, repeat: int = 0, n: int = 16, pace: float | None = None
) -> BenchResult:
    rng = np.random.default_rng(hash((label, concurrency, repeat)) % 2**32)
    records = []
    for i in range(n):
        start = i * 0.05
        ttft = 0.2 + 0.05 * i + rng.uniform(0, 0.02)
        gaps = rng.normal(concurrency / tok_s, 0.002, 31).clip(0.001)
        chunks = tuple(float(ttft + x) for x in np.concatenate([[0.0], np.cumsum(gaps)]))
        records.append(
            RequestRecord(
                index=i,
                status="ok",
                scheduled_s=start,
                start_s=start,
                ttft_s=ttft,
                e2e_s=chunks[-1],
                end_s=chunks[-1],
                chunk_times_s=chunks,
                prompt_tokens=128,
                output_tokens=32,
            )
        )
    duration = max(r.start_s + r.e2e_s for r in records if r.start_s is not None and r.e2e_s is not None)
    summary = summarize(records, duration)
    return BenchResult(
        summary,
        records_frame(records),
        Provenance(
            url="http://127.0.0.1:30000",
            backend="dsv4lab",
            api="completions",
            server_info={"twin": {"pace": pace}} if pace else {},
        ),
        concurrency=concurrency,
        repeat=repeat,
        label=label,
    )


def _trace() -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    ts = 0.0
    for _ in range(20):
        for name, dur in (
            ("_fwd_sparse_mla_decode_kernel_sm120_triton", 630.0),
            ("fused_moe_kernel", 160.0),
            ("_w8a8_block_fp8_matmul", 90.0),
            ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 40.0),
            ("elementwise_kernel", 80.0),
        ):
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur})
            ts += dur
    return {"traceEvents": events}


# -- memory ------------------------------------------------------------------------------------------------------------


def test_memory_timeline_marks_phases_capacity_static_line_and_oom() -> None:
    chart = plots.memory_timeline(
        _samples(),
        phases=_phases(),
        oom=_oom(),
        mem_fraction_static=0.70,
        free_before_load_gib=94.24,
        config="Config B",
    )
    spec, svg = _check(chart)
    titles = _titles(spec)
    assert any(t.startswith("Config B: GPU 1 ran out of memory in CUDA graph capture") for t in titles)
    assert "GPU memory used (GiB)" in _axis_titles(spec) and "time since sampling started (s)" in _axis_titles(spec)
    texts = _texts(spec)
    assert "OOM on GPU 1: tried 4.48 GiB, 0.15 GiB free" in texts
    assert any(t.startswith("capacity 95.6 GiB") for t in texts)
    assert any("mem_fraction_static 0.70" in t for t in texts)
    assert {"init", "weights", "KV pool", "CUDA graph capture", "crash"} <= set(texts)
    assert {f"GPU {g}" for g in range(8)} <= set(texts)
    assert "OOM on GPU 1" in svg
    # The static line sits where SGLang caps weights + KV: context/others + 0.70 x free before load.
    static = [r for rows in _datasets(spec).values() for r in rows if "mem_fraction_static" in str(r.get("label"))]
    assert static[0]["y"] == pytest.approx(95.59 - 94.24 + 0.70 * 94.24, abs=0.01)


def test_an_hour_at_2hz_on_8_gpus_keeps_the_spike_under_5000_points() -> None:
    big = _samples(hours=1.0)
    assert len(big) == 8 * 7200
    small = plots.downsample_timeline(big)
    assert len(small) <= 5000
    top = small.sort_values("used_mib").iloc[-1]
    assert top["used_mib"] == 97_700 and top["gpu"] == 1
    spec, _ = _check(plots.memory_timeline(big, oom=_oom(3600.0)))
    peak = max(r["used_gib"] for rows in _datasets(spec).values() for r in rows if "used_gib" in r and "GPU" in r)
    assert peak == pytest.approx(97_700 / 1024, abs=0.01)


def test_memory_timeline_refuses_empty_input() -> None:
    with pytest.raises(PlotError, match="no GPU samples"):
        plots.memory_timeline(_samples().iloc[0:0])
    with pytest.raises(PlotError, match="no samples for GPUs"):
        plots.memory_timeline(_samples(), gpus=[9])


def test_memory_budget_side_by_side_predicted_and_observed() -> None:
    log = DATA / "sglang_0_5_4_tp2_eagle_capture_oom.log"
    runs = {
        "Config A": (preflight(config_a(), "rtx-pro-6000-x8"), None),
        "Config B": (preflight(config_b(), "rtx-pro-6000-x8"), None),
        "Config B-fixed": (preflight(config_b_fixed(), "rtx-pro-6000-x8"), None),
        "toy (log)": (None, observed_budget(log)),
    }
    spec, svg = _check(plots.memory_budget(runs))
    titles = _titles(spec)
    assert any(t.startswith("Config B is ") and "GiB short in CUDA graph capture" in t for t in titles)
    assert "GPU memory (GiB)" in _axis_titles(spec)
    texts = set(_texts(spec))
    assert {"Config A · GPU 1", "Config B · GPU 1", "Config B-fixed · GPU 1", "toy (log) · GPU 1"} <= texts
    assert {"weights", "KV pool", "graph pools", "free", "short"} <= texts
    assert any(t.startswith("short 2") for t in texts) and "OOM" in texts
    assert "Config B · GPU 1" in svg
    all_gpus = _spec(plots.memory_budget(runs, gpus="all"))
    assert "Config A · GPU 7" in set(_texts(all_gpus))
    with pytest.raises(PlotError):
        plots.memory_budget({})


# -- benchmarks -------------------------------------------------------------------------------------------------------


def _ab(pace: float | None = None) -> tuple[list[BenchResult], list[BenchResult]]:
    a = [_result("Config A", c, 4.5 if c == 1 else 23.0, rep, pace=pace) for c in (1, 16) for rep in range(3)]
    b = [_result("Config B-fixed", c, 6.6 if c == 1 else 23.0, rep, pace=pace) for c in (1, 16) for rep in range(3)]
    return a, b


def test_throughput_vs_concurrency_shows_both_configs_with_intervals_and_verdicts() -> None:
    a, b = _ab(pace=0.05)
    comparison = compare(a, b)
    chart = plots.throughput_vs_concurrency(comparison)
    spec, _ = _check(chart)
    assert any(t.startswith("Config B-fixed vs Config A: ") for t in _titles(spec))
    assert plots.MODELLED in _axis_titles(spec) and "concurrency (requests in flight)" in _axis_titles(spec)
    rows = [r for rows in _datasets(spec).values() for r in rows if "mean" in r]
    assert {r["config"] for r in rows} == {"Config A", "Config B-fixed"}
    for r in rows:
        assert r["low"] <= r["mean"] <= r["high"]
    lv1 = comparison.at(1)
    # A twin's figures come from its stamps, on the modelled hardware's clock already: compared as they are.
    twin_mean = sum(r.summary.output_throughput for r in a if r.concurrency == 1) / 3
    assert lv1.mean_a == pytest.approx(twin_mean)
    assert any(r["mean"] == pytest.approx(lv1.mean_a) for r in rows)
    real = plots.throughput_vs_concurrency(compare(*_ab()))
    assert plots.MEASURED in _axis_titles(_spec(real))
    texts = _texts(spec)
    assert lv1.verdict in texts and any(t.startswith(f"{lv1.rel_diff:+.0%} (95% CI") for t in texts)


def test_latency_distributions_and_request_timeline() -> None:
    a, b = _ab()
    spec, _ = _check(plots.latency_distributions([a[0], a[3], b[0], b[3]]))
    assert {"time to first token (ms)", "inter-token latency (ms)"} <= set(_axis_titles(spec))
    rows = [r for rows in _datasets(spec).values() for r in rows if "p50" in r]
    assert all(r["p5"] <= r["p25"] <= r["p50"] <= r["p75"] <= r["p95"] for r in rows)
    assert {r["run"] for r in rows} == {
        "Config A · C=1",
        "Config A · C=16",
        "Config B-fixed · C=1",
        "Config B-fixed · C=16",
    }

    spec, _ = _check(plots.request_timeline(a[3]))
    assert any(t.startswith("Config A: 16 of 16 requests at concurrency 16") for t in _titles(spec))
    parts = {r["part"] for rows in _datasets(spec).values() for r in rows if "part" in r}
    assert parts == {"waiting for first token", "decoding"}
    assert "time since the run started (s)" in _axis_titles(spec)


def test_request_timeline_thins_a_huge_run() -> None:
    spec, _ = _check(plots.request_timeline(_result("big", 64, 500.0, n=3000), max_requests=400))
    shown = {r["request"] for rows in _datasets(spec).values() for r in rows if "request" in r}
    assert len(shown) == 400
    assert any("of 3,000 requests shown" in t for t in _titles(spec))


def test_roofline_gap_puts_measured_bound_and_goal_on_one_log_axis() -> None:
    bounds = [decode_roofline("rtx-pro-6000-x8", concurrency=c) for c in (1, 16)]
    spec, _ = _check(plots.roofline_gap({"Config A, C=16": 23.0, "Config B-fixed, C=1": 6.6}, bounds))
    assert any(t.startswith("Config A, C=16: 23.0 tok/s, 43x below the 1,000 tok/s goal") for t in _titles(spec))
    assert "output throughput (tok/s) (log scale)" in _axis_titles(spec)
    twin = _spec(plots.roofline_gap({"Config A, C=16": 23.0}, bounds, clock=Clock.twin(0.02)))
    assert "output throughput (tok/s, modelled hardware) (log scale)" in _axis_titles(twin)
    assert "goal 1,000 tok/s" in _texts(spec)
    scales = [d.get("scale", {}).get("type") for d in _walk(spec) if isinstance(d.get("scale"), dict)]
    assert "log" in scales
    assert _colour_domains(spec) == [["measured", "roofline (memory bandwidth)"]]


def test_roofline_gap_without_a_roofline_lists_and_explains_none() -> None:
    # The panel's bench chart draws measured bars only: its legend must not offer a grey roofline bar.
    spec, _ = _check(plots.roofline_gap({"config-b-fixed C=1": 6.8, "config-b-fixed C=4": 17.1}))
    assert _colour_domains(spec) == [["measured"]]
    assert not any("roofline" in t for t in _titles(spec))


def _colour_domains(spec: dict[str, Any]) -> list[Any]:
    return [
        d["color"]["scale"]["domain"]
        for d in _walk(spec)
        if isinstance(d.get("color"), dict) and "domain" in d["color"].get("scale", {})
    ]


# -- server ---------------------------------------------------------------------------------------------------------


def _decode_log(n: int, spec_decoding: bool) -> list[str]:
    lines = []
    for i in range(n):
        ts = (T0 + pd.Timedelta(seconds=2 * i)).strftime("%Y-%m-%d %H:%M:%S")
        accept = f"accept len: {1.6 + 0.1 * math.sin(i):.2f}, accept rate: 0.80, " if spec_decoding else ""
        lines.append(
            f"[{ts} TP0] Decode batch, #running-req: 16, #token: {8000 + 40 * i}, token usage: 0.0{i % 10}, "
            f"{accept}cuda graph: True, gen throughput (token/s): {20 + i % 5:.2f}, #queue-req: 0"
        )
    return lines


def test_decode_stats_from_log_lines() -> None:
    spec, _ = _check(plots.decode_stats(_decode_log(50, True), tz=UTC, config="Config B-fixed"))
    titles = _titles(spec)
    assert any(t.startswith("Config B-fixed: median generation ") and "accepted per step" in t for t in titles)
    assert {"tok/s generated", "accepted / step", "KV pool used (%)", "running requests"} <= set(_axis_titles(spec))
    plain = _spec(plots.decode_stats(_decode_log(5, False), tz=UTC))
    assert "accepted / step" not in _axis_titles(plain)
    long = _spec(plots.decode_stats(_decode_log(6000, True), tz=UTC))
    assert sum(len(r) for r in _datasets(long).values()) <= 5000
    with pytest.raises(PlotError, match="no decode-batch lines"):
        plots.decode_stats(["[2026-05-04 10:00:00] nothing here"])


def test_kernel_breakdown_names_the_dominant_kind() -> None:
    spec, svg = _check(plots.kernel_breakdown(kernel_breakdown(_trace())))
    assert any(t.startswith("Attention kernels take 63% of GPU time") for t in _titles(spec))
    assert "share of GPU kernel time (%)" in _axis_titles(spec)
    assert "_fwd_sparse_mla_decode_kernel_sm120_triton" in _texts(spec)
    assert "63%" in svg


# -- rendering ---------------------------------------------------------------------------------------------------------


def test_svg_png_and_the_offline_renderer(tmp_path: Path) -> None:
    chart = plots.kernel_breakdown(kernel_breakdown(_trace()))
    figure = plots.svg_figure(chart, caption="GPU time")
    assert figure.startswith('<figure class="dsv4lab-chart"><svg') and "<figcaption>GPU time</figcaption>" in figure
    png = plots.save_png(chart, tmp_path / "k.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    before = alt.renderers.active
    try:
        plots.enable_offline_renderer()
        renderer: Any = alt.renderers.get()
        bundle, metadata = renderer(plots.to_spec(chart))
    finally:
        alt.renderers.enable(before)
    # The images say what the chart shows: the report writes this alt text on them.
    assert metadata["image/svg+xml"]["alt"] == plots.alt_text(chart) and "Attention kernels" in plots.alt_text(chart)
    keys = set(bundle)
    vega = [k for k in keys if k.startswith("application/vnd.vegalite.v")]
    assert vega and "image/svg+xml" in keys and "text/plain" in keys
    assert bundle["image/svg+xml"].lstrip().startswith("<svg")
    assert "Attention kernels" in bundle["text/plain"]
    json.dumps(bundle[vega[0]])  # the notebook stores it as JSON


def test_rendering_never_fetches_data() -> None:
    # A chart that points at a URL instead of embedding its data must fail to render, not download it.
    remote = alt.Chart(alt.UrlData("http://127.0.0.1:9/samples.json")).mark_line().encode(x="t:Q", y="used_gib:Q")
    with pytest.raises(PlotError, match="External data url not allowed"):
        plots.to_svg(remote)
