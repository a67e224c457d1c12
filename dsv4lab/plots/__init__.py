"""Charts for the campaign's numbers, one function per chart, all Altair, all offline.

=============================  ===================================================================
``memory_timeline``            GPU memory over time, startup phases as bands, capacity, OOM marked
``memory_budget``              per-GPU budget, predicted vs observed, configs side by side
``throughput_vs_concurrency``  A vs B output throughput with 95 % confidence intervals
``latency_distributions``      TTFT and ITL per run
``request_timeline``           each request of one run: queued, waiting for the first token, decoding
``decode_stats``               the server's decode-batch lines over time
``kernel_breakdown``           GPU time by kernel kind and the top kernels
``roofline_gap``               measured tok/s vs the bandwidth roofline vs the goal
=============================  ===================================================================

Rendering: :func:`to_svg` (inline in HTML reports), :func:`save_png` (slides), :func:`to_spec` (validated
Vega-Lite), :func:`enable_offline_renderer` (JupyterLab + nbconvert without a CDN).
"""

from __future__ import annotations

from dsv4lab.plots.bench import (
    MEASURED,
    MODELLED,
    latency_distributions,
    request_timeline,
    roofline_gap,
    throughput_vs_concurrency,
)
from dsv4lab.plots.export import (
    alt_text,
    display_metadata,
    enable_offline_renderer,
    mimebundle,
    save_png,
    svg_figure,
    to_spec,
    to_svg,
)
from dsv4lab.plots.memory_charts import downsample_timeline, memory_budget, memory_timeline
from dsv4lab.plots.server_charts import decode_stats, kernel_breakdown
from dsv4lab.plots.theme import register_theme

register_theme()

__all__ = [
    "MEASURED",
    "MODELLED",
    "alt_text",
    "decode_stats",
    "display_metadata",
    "downsample_timeline",
    "enable_offline_renderer",
    "kernel_breakdown",
    "latency_distributions",
    "memory_budget",
    "memory_timeline",
    "mimebundle",
    "request_timeline",
    "roofline_gap",
    "save_png",
    "svg_figure",
    "throughput_vs_concurrency",
    "to_spec",
    "to_svg",
]
