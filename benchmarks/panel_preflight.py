"""What one slider move costs in the config panel, against one bare ``memory.preflight`` call.

The panel's promise is "move a slider and see at once whether it fits": every change rebuilds the config
from the controls, re-runs the preflight, finds fixes when it does not fit (``memory.suggest``, a few dozen
more preflights), diffs against the preset and redraws the verdict — all on the thread that handled the
change, so it must stay well under 100 ms. The budget chart is drawn afterwards in its own thread (vl-convert
takes longer than the whole budget); its time to appear is reported separately.

Not a timed test: run by hand, the figures go in docs/measured.md. Widgets run without a kernel (as in the tests).

    .venv/bin/python benchmarks/panel_preflight.py --moves 200
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4lab.config.presets import config_b_fixed  # noqa: E402
from dsv4lab.model.memory import preflight  # noqa: E402
from dsv4lab.notebook.widgets import ConfigPanel  # noqa: E402


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--moves", type=int, default=200, help="slider moves per case")
    args = ap.parse_args()

    config = config_b_fixed()
    bare = []
    for _ in range(args.moves):
        t = time.perf_counter()
        preflight(config, "rtx-pro-6000-x8")
        bare.append(time.perf_counter() - t)
    bare_ms = statistics.median(bare) * 1000

    panel = ConfigPanel(preset="config_b_fixed", debounce_s=0, charts=False)
    fraction = panel.controls["mem_fraction_static"].input
    cases = {
        # Moves that keep it fitting: config, preflight, diff, verdict.
        "fits (0.50-0.65)": ([round(0.50 + 0.01 * (i % 16), 2) for i in range(args.moves)], 16),
        # Graph cap cleared: every move is an OOM, so suggest() searches for fixes too.
        "OOM, with fixes (cap unset)": ([round(0.55 + 0.01 * (i % 16), 2) for i in range(args.moves)], None),
    }
    print(f"bare memory.preflight: median {bare_ms:.2f} ms ({args.moves} calls)")
    for name, (values, cap) in cases.items():
        panel.set(cuda_graph_max_bs=cap)
        times = []
        for v in values:
            fraction.value = v  # what the front end does: the observer runs the (synchronous) preflight
            assert panel.last_refresh_s is not None
            times.append(panel.last_refresh_s)
        med, p95 = statistics.median(times) * 1000, pct(times, 0.95) * 1000
        print(
            f"{name}: median {med:.1f} ms, p95 {p95:.1f} ms, max {max(times) * 1000:.1f} ms per move "
            f"= {med / bare_ms:.0f}x one bare preflight (verdict now: {panel.verdict})"
        )

    charted = ConfigPanel(preset="config_b_fixed", debounce_s=0, charts=True)
    charted.wait_idle(60)  # the first render starts vl-convert's engine
    chart_s = []
    for cap in (None, 16, None, 16, None):
        t = time.perf_counter()
        charted.set(cuda_graph_max_bs=cap)
        charted.view.chart.wait_idle(60)
        chart_s.append(time.perf_counter() - t)
    print(f"budget chart after a move (own thread, not on the slider's): median {statistics.median(chart_s):.2f} s")


if __name__ == "__main__":
    main()
