"""The twin keeps its own time: the story's campaign, run three times, gives the same modelled figures.

Runs ``dsv4lab demo`` (the campaign of STORY.md on the twin, in virtual time) into three fresh folders: twice
on a quiet machine, and once while two busy-loop processes load both cores. Then it writes every modelled
figure of every step's ``results.json`` (the figures and the headline measurements, sorted; left out: the
watcher's wall-clock reaction time and run-directory paths) to one text file per run and compares them, and
prints the wall time of each campaign beside the quiet one's (a ratio: the machine is shared). With
``--tune`` it also times the README's ``dsv4lab tune`` example.

Usage::

    .venv/bin/python benchmarks/twin_determinism.py [--out DIR] [--tune]

It prints the ``diff`` command for the figure files and its output (empty when they are identical).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable

#: Figures that are not modelled: the watcher's reaction time is this machine's wall clock, paths differ.
NOT_MODELLED = ("detected_after_s", "server_dir", "run_dir")
TUNE = [
    "tune",
    "--preset",
    "config_b_fixed",
    "--twin",
    "--space",
    "cuda_graph_max_bs=8,16,256",
    "--space",
    "chunked_prefill_size=2048,8192",
    "--slo",
    "tpot_p99_ms=2000",
    "--budget",
    "4",
]


def figures(reports: Path) -> list[str]:
    """One line per modelled figure and measurement of the campaign under ``reports``, in step order."""
    lines: list[str] = []
    for f in sorted((reports / "dsv4-story").glob("*/results.json"), key=lambda p: p.parent.name.split("-", 2)[-1]):
        data = json.loads(f.read_text(encoding="utf-8"))
        nb = data["notebook"]
        for key, value in sorted((data.get("figures") or {}).items()):
            if key in NOT_MODELLED or key.endswith("run_dir"):
                continue
            lines.append(f"{nb} {key} {json.dumps(value, sort_keys=True)}")
        lines += [f"{nb} measurement {json.dumps(m, sort_keys=True)}" for m in data.get("measurements") or []]
    return lines


def campaign(reports: Path) -> float:
    """Run the campaign into ``reports``; its wall time in seconds."""
    t0 = time.perf_counter()
    subprocess.run([PY, "-m", "dsv4lab", "demo", "--reports", str(reports)], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--tune", action="store_true", help="also time the README's dsv4lab tune example")
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="twin-determinism-"))
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}
    for name in ("quiet-1", "quiet-2"):
        times[name] = campaign(out / name)
    busy = [subprocess.Popen([PY, "-c", "while True: pass"]) for _ in range(2)]
    try:
        times["loaded"] = campaign(out / "loaded")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    files = {}
    for name in times:
        files[name] = out / f"{name}.figures.txt"
        files[name].write_text("\n".join(figures(out / name)) + "\n", encoding="utf-8")
    print(f"campaign wall time: {', '.join(f'{k} {v:.1f} s' for k, v in times.items())}")
    print(f"loaded / quiet-1: {times['loaded'] / times['quiet-1']:.2f}")
    same = True
    for other in ("quiet-2", "loaded"):
        cmd = ["diff", str(files["quiet-1"]), str(files[other])]
        diff = subprocess.run(cmd, capture_output=True, text=True)
        print(f"$ {' '.join(cmd)}  # {len(files['quiet-1'].read_text().splitlines())} figures")
        print(diff.stdout, end="")
        same = same and diff.returncode == 0
    print("identical" if same else "DIFFERENT")
    if args.tune:
        t0 = time.perf_counter()
        run = subprocess.run(
            [PY, "-m", "dsv4lab", *TUNE, "--reports", str(out / "tune")], capture_output=True, text=True, check=False
        )
        print(f"dsv4lab {' '.join(TUNE)}: exit {run.returncode}, {time.perf_counter() - t0:.1f} s wall")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
