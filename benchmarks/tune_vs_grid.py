"""The tuner against brute force on the twin: does ``lab.tune`` reach the full grid's best in a third of its
launches?

A space of 24 points around Config B-fixed (``mem_fraction_static`` x ``cuda_graph_max_bs`` x
``chunked_prefill_size``), some of which the memory model predicts cannot capture their CUDA graphs. The grid
runs every point the model lets start (brute force would also launch the others and watch them crash: its
cost is counted as all 24 launches), each benchmarked at one concurrency; then the tuner runs with a budget of
24 / 3 = 8 launches, once per seed. A seed succeeds when the point it chose scored, in the grid's own
measurement, within the twin's run-to-run noise of the grid's best: the grid's best point is run ``--repeats``
more times and the noise is twice the spread (standard deviation) of those runs. The script prints one line
per seed and a JSON summary.

Every launch is a twin server on this machine (no GPU), in virtual time unless ``--pace`` paces it (figures are
on the modelled hardware's clock, as in every report).

Usage::

    DSV4LAB_BASE_PORT=25000 .venv/bin/python benchmarks/tune_vs_grid.py [--seeds 5] [--repeats 3]
        [--pace 0.02] [--out tune_vs_grid.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dsv4lab import Lab  # noqa: E402

SPACE: dict[str, list[Any]] = {
    "mem_fraction_static": [0.80, 0.86, 0.92],
    "cuda_graph_max_bs": [4, 8, 16, 256],
    "chunked_prefill_size": [2048, 8192],
}
LOAD: dict[str, Any] = {"concurrency": 16, "input_len": 2000, "output_len": 48}


def _key(values: dict[str, Any]) -> str:
    return json.dumps(values, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3, help="extra runs of the grid's best, for the noise")
    ap.add_argument("--pace", type=float, default=None, help="pace the twins (default: virtual time)")
    ap.add_argument("--out", default=None, help="write the summary JSON here")
    args = ap.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="tune-vs-grid-"))
    lab = Lab(run_root=root / "runs", pace=args.pace, progress=False)
    grid_size = 1
    for values in SPACE.values():
        grid_size *= len(values)
    budget = grid_size // 3
    try:
        began = time.monotonic()
        # The grid: a tuning run whose budget is every point the model lets start runs each of them once.
        probe = lab.tune("config_b_fixed", SPACE, budget=1, **LOAD, folder=root / "probe", name="probe")
        launchable = grid_size - len(probe.ruled_out)
        grid = lab.tune("config_b_fixed", SPACE, budget=launchable, **LOAD, folder=root / "grid", name="grid")
        grid_s = time.monotonic() - began
        scores = {_key(t.values): t.score or 0.0 for t in grid.trials}
        best = grid.best
        assert best is not None, "no point of the grid ran"
        again = [best.score or 0.0]
        config = lab.config("config_b_fixed", **best.values)
        for i in range(args.repeats):  # the same point again, launched and benchmarked as a trial is
            server = lab.launch(config, name=f"repeat-{i}", sample_gpus=False).wait()
            (run,) = server.bench(
                [LOAD["concurrency"]], input_len=LOAD["input_len"], output_len=LOAD["output_len"], seed=0
            )
            server.stop()
            again.append(run.on_hardware.output_throughput / 8)
        noise = 2 * statistics.stdev(again) if len(again) > 1 else 0.0
        print(
            f"grid: {launchable} launches of {grid_size} points ({len(grid.ruled_out)} ruled out) in {grid_s:.0f} s; "
            f"best {best.label}: {best.score:.2f} tok/s per GPU; repeats {', '.join(f'{s:.2f}' for s in again)}; "
            f"noise (2 sd) {noise:.2f}"
        )
        seeds: list[dict[str, Any]] = []
        for seed in range(args.seeds):
            began = time.monotonic()
            tuned = lab.tune(
                "config_b_fixed", SPACE, budget=budget, seed=seed, **LOAD, folder=root / f"seed-{seed}", name="tuned"
            )
            chosen = tuned.best
            chosen_grid = scores.get(_key(chosen.values), 0.0) if chosen is not None else 0.0
            reached = chosen_grid >= (best.score or 0.0) - noise
            first = next(
                (t.number for t in tuned.trials if scores.get(_key(t.values), 0.0) >= (best.score or 0.0) - noise),
                None,
            )
            seeds.append(
                {
                    "seed": seed,
                    "launches": tuned.launches,
                    "chosen": chosen.values if chosen is not None else None,
                    "chosen_score": chosen.score if chosen is not None else None,
                    "chosen_grid_score": chosen_grid,
                    "reached": reached,
                    "first_launch_within_noise": first,
                    "seconds": time.monotonic() - began,
                }
            )
            print(
                f"seed {seed}: {tuned.launches} launches, chose {chosen.label if chosen else '-'} "
                f"(grid score {chosen_grid:.2f}); within noise of the grid's best: {'yes' if reached else 'NO'}; "
                f"first such launch: {first}"
            )
        summary = {
            "space": SPACE,
            "load": LOAD,
            "pace": args.pace,
            "grid_points": grid_size,
            "ruled_out": len(grid.ruled_out),
            "grid_launches": launchable,
            "brute_force_launches": grid_size,
            "budget": budget,
            "grid_best": {"values": best.values, "score": best.score},
            "repeats_of_best": again,
            "noise": noise,
            "seeds": seeds,
            "reached": sum(bool(s["reached"]) for s in seeds),
        }
        print(json.dumps(summary))
        if args.out:
            Path(args.out).write_text(json.dumps(summary, indent=2))
        return 0 if summary["reached"] == len(seeds) else 1
    finally:
        lab.close()


if __name__ == "__main__":
    sys.exit(main())
