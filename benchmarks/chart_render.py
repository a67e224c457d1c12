"""What the charts cost: build + SVG render time and SVG size, above all for the big memory timeline —
next to the same timeline with every sample embedded (what a chart without aggregation would carry).

Not a timed test: run by hand, figures go in docs/measured.md. The big timeline is 8 GPUs sampled at 2 Hz for
an hour (57,600 samples) with one OOM spike; dsv4lab keeps each GPU's min and max per time bucket (at most
5,000 points). The peer embeds all 57,600 (Altair's row limit lifted). Every other chart is timed on data
of the size a campaign produces (the tests' builders). vl-convert renders with no network.

    .venv/bin/python benchmarks/chart_render.py --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert as vlc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4lab import plots  # noqa: E402
from dsv4lab.bench import compare  # noqa: E402
from dsv4lab.config.presets import config_a, config_b, config_b_fixed  # noqa: E402
from dsv4lab.model.memory import preflight  # noqa: E402
from dsv4lab.model.roofline import decode_roofline  # noqa: E402
from dsv4lab.plots.theme import theme_enabled  # noqa: E402
from dsv4lab.serving.profiling import kernel_breakdown  # noqa: E402
from tests.test_plots import _ab, _decode_log, _oom, _phases, _samples, _trace  # noqa: E402


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def build_and_render(make: Callable[[], Any]) -> tuple[str, dict[str, Any]]:
    chart = make()
    spec = plots.to_spec(chart)
    return plots.to_svg(spec), spec


def naive_timeline(samples: Any) -> str:
    """The same lines with every sample embedded: no bucketing, Altair's 5,000-row limit lifted."""
    data = samples.assign(used_gib=samples["used_mib"] / 1024, GPU="GPU " + samples["gpu"].astype(str))
    chart = (
        alt.Chart(data[["t", "used_gib", "GPU"]])
        .mark_line(interpolate="step-after")
        .encode(x="t:Q", y="used_gib:Q", color="GPU:N")
        .properties(width=640, height=320)
    )
    with alt.data_transformers.disable_max_rows(), theme_enabled():
        spec = chart.to_dict()
    svg: str = vlc.vegalite_to_svg(spec, allowed_base_urls=[])
    return svg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--png", default="/tmp/plots/timeline-1h.png", help="where to write the big timeline's PNG")
    args = parser.parse_args()

    big = _samples(hours=1.0)
    phases, oom = _phases(3600.0), _oom(3600.0)
    print(f"big timeline: {len(big):,} samples (8 GPUs, 2 Hz, 1 hour)")

    def ours() -> tuple[str, dict[str, Any]]:
        return build_and_render(
            lambda: plots.memory_timeline(big, phases=phases, oom=oom, mem_fraction_static=0.7, config="Config B")
        )

    t_build, chart = timed(
        lambda: plots.memory_timeline(big, phases=phases, oom=oom, mem_fraction_static=0.7), args.repeats
    )
    t_ours, (svg, spec) = timed(ours, args.repeats)
    rows = sum(len(v) for v in spec.get("datasets", {}).values())
    t_naive, naive_svg = timed(lambda: naive_timeline(big), max(1, args.repeats - 1))
    t_png, _ = timed(lambda: plots.save_png(chart, args.png), 1)
    print(
        f"  dsv4lab: build (incl. downsampling) {t_build * 1000:.0f} ms; build + spec + SVG {t_ours:.2f} s; "
        f"{rows:,} rows embedded; SVG {len(svg) / 1024:.0f} KiB; PNG (2x) {t_png:.2f} s -> {args.png}"
    )
    print(f"  all samples embedded: SVG {t_naive:.2f} s, {len(naive_svg) / 1024:.0f} KiB")
    print(f"  -> {t_naive / t_ours:.1f}x faster, {len(naive_svg) / len(svg):.1f}x smaller, spike kept")

    a, b = _ab()
    comparison = compare(a, b)
    log = ROOT / "tests" / "data" / "logs" / "sglang_0_5_4_tp2_eagle_capture_oom.log"
    from dsv4lab.model.budget import observed_budget

    charts: dict[str, Callable[[], Any]] = {
        "memory_timeline (30 s, 8 GPUs)": lambda: plots.memory_timeline(
            _samples(), phases=_phases(), oom=_oom(), mem_fraction_static=0.7
        ),
        "memory_budget (3 configs + 1 log)": lambda: plots.memory_budget(
            {
                "Config A": (preflight(config_a()), None),
                "Config B": (preflight(config_b()), None),
                "Config B-fixed": (preflight(config_b_fixed()), None),
                "toy": (None, observed_budget(log)),
            }
        ),
        "throughput_vs_concurrency": lambda: plots.throughput_vs_concurrency(comparison),
        "latency_distributions (4 runs)": lambda: plots.latency_distributions([a[0], a[3], b[0], b[3]]),
        "request_timeline (16 requests)": lambda: plots.request_timeline(a[3]),
        "decode_stats (600 lines)": lambda: plots.decode_stats(_decode_log(600, True)),
        "kernel_breakdown": lambda: plots.kernel_breakdown(kernel_breakdown(_trace())),
        "roofline_gap": lambda: plots.roofline_gap(
            {"A": 23.0, "B-fixed": 23.0}, [decode_roofline("rtx-pro-6000-x8", concurrency=c) for c in (1, 16)]
        ),
    }
    print(f"\n{'chart':<36} {'build+SVG':>10} {'SVG KiB':>8}")
    for name, make in charts.items():
        t, (svg_one, _) = timed(lambda make=make: build_and_render(make), args.repeats)  # type: ignore[misc]
        print(f"{name:<36} {t * 1000:>8.0f}ms {len(svg_one) / 1024:>8.0f}")


if __name__ == "__main__":
    main()
