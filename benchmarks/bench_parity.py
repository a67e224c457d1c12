"""Parity of ``dsv4lab bench`` with SGLang's own ``bench_serving``: the same twin, the same workload, both clients.

One twin (Config A on the rtx-pro-6000-x8 profile, SGLang 0.5.23 syntax, paced at 0.1 by default) serves
every run. At each concurrency level the clients take turns, and the order flips every repeat (so drift in
the twin lands on both): SGLang 0.5.23's ``bench_serving`` (``--backend sglang``, the ``/generate``
endpoint, ``random-ids`` prompts of fixed length), ``dsv4lab bench`` in its compatible mode (``--ttft-clock
connect --itl-unit token``) and ``dsv4lab bench`` with its defaults (clock from the send); with
``--explain-gc`` also bench_serving with its garbage collector off (its process holds torch and
transformers, and one full collection takes hundreds of ms on a slow core). Each writes
bench_serving's JSONL (dsv4lab through ``--output-file``), and the script prints dsv4lab / bench_serving for
every shared metric — the ratio of the means over the repeats, and the range of the per-repeat ratios.

Against the twin, dsv4lab takes its figures from the twin's stamps (modelled seconds), while bench_serving
reads the wall clock of a paced twin; its times are divided by the pace (and its rates multiplied) so both
are on the modelled scale. A ratio off 1 is then bench_serving's reading of the host's lag, not a difference
of definitions: for those, ``benchmarks/vllm_parity.py`` compares both clients' wall clocks on a real engine.

The real ``bench_serving`` comes from the venv ``make test`` builds (``benchmarks/sglang_peer.py``); without
it the script says why and stops. Both clients run in this machine's shared CPUs beside the twin, one at a
time.

Usage::

    .venv/bin/python benchmarks/bench_parity.py [--repeats 2] [--concurrency 1,16] [--pace 0.1] [--explain-gc]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

#: The shared metrics, as bench_serving's JSONL names them; the issue's bar is 2% in the compatible mode.
METRICS = (
    "completed",
    "total_output_tokens",
    "output_throughput",
    "request_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "mean_e2e_latency_ms",
)
TOLERANCE = 0.02


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_twin(port: int, pace: float, work: Path) -> subprocess.Popen[bytes]:
    from dsv4lab.config.launch_script import render_argv
    from dsv4lab.config.presets import config_a

    config = config_a().replace(port=port, kernel_config_dir=None)
    argv = [sys.executable, "-m", "dsv4lab.twin", *render_argv(config, "0.5.23")]
    env = {
        **os.environ,
        "DSV4LAB_TWIN_HARDWARE": "rtx-pro-6000-x8",
        "DSV4LAB_TWIN_PACE": str(pace),
        "DSV4LAB_TWIN_STATE_DIR": str(work / "twin-state"),
    }
    log = (work / "twin.log").open("ab")
    proc = subprocess.Popen(argv, env=env, stdout=log, stderr=log, cwd=ROOT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the twin exited with {proc.returncode}; see {work / 'twin.log'}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the twin did not become healthy within 600 s")


def _stop_twin(proc: subprocess.Popen[bytes]) -> None:
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: the twin and its scheduler processes
    except ProcessLookupError:
        return
    proc.wait(timeout=30)


def _dsv4lab(url: str, level: int, args: argparse.Namespace, seed: int, out: Path, *, compat: bool) -> dict[str, Any]:
    argv = [sys.executable, "-m", "dsv4lab", "bench", "--url", url, "--backend", "sglang", "--concurrency", str(level)]
    argv += ["--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len)]
    argv += ["--output-len", str(args.output_len), "--seed", str(seed), "--no-progress", "--output-file", str(out)]
    if compat:
        argv += ["--ttft-clock", "connect", "--itl-unit", "token"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"dsv4lab bench failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    record: dict[str, Any] = json.loads(out.read_text().splitlines()[-1])
    return record


def _peer(
    peer: Any, url: str, level: int, args: argparse.Namespace, seed: int, out: Path, *, gc_off: bool = False
) -> dict[str, Any]:
    from sglang_peer import run_peer

    argv = ["--backend", "sglang", "--base-url", url, "--dataset-name", "random-ids"]
    argv += ["--num-prompts", str(args.num_prompts), "--random-input-len", str(args.input_len)]
    argv += ["--random-output-len", str(args.output_len), "--random-range-ratio", "1"]
    argv += ["--max-concurrency", str(level), "--warmup-requests", "1", "--seed", str(seed), "--disable-tqdm"]
    return _on_modelled_scale(run_peer(peer, argv, out, gc_off=gc_off).result, args.pace)


def _on_modelled_scale(record: dict[str, Any], pace: float) -> dict[str, Any]:
    """bench_serving's wall-clock reading of a paced twin, in the twin's modelled seconds (what dsv4lab reports)."""
    out = dict(record)
    for key, value in record.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key.endswith("_ms") or key == "duration":
            out[key] = value / pace
        elif key.endswith("_throughput"):
            out[key] = value * pace
    return out


def _ratio_line(metric: str, ours: list[float], theirs: list[float], check: bool) -> str:
    if not ours or not theirs or statistics.mean(theirs) == 0:
        return f"  {metric:<22} (no data)"
    ratio = statistics.mean(ours) / statistics.mean(theirs)
    per = [a / b for a, b in zip(ours, theirs, strict=True) if b]
    verdict = ""
    if check:
        verdict = "ok" if abs(ratio - 1) <= TOLERANCE else f"outside {TOLERANCE:.0%}"
    return (
        f"  {metric:<22} {statistics.mean(theirs):>11.2f} {statistics.mean(ours):>11.2f} {ratio:>8.3f}"
        f"   {min(per):.3f}-{max(per):.3f}   {verdict}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--peer-python", default=None, help="SGLang venv python (default: the one make test builds)")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each client per level (default 2)")
    parser.add_argument("--concurrency", default="1,16", help="levels (default 1,16)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--pace", type=float, default=0.1, help="the twin's pace on the wall clock (default 0.1)")
    parser.add_argument(
        "--explain-gc",
        action="store_true",
        help="also run bench_serving with its garbage collector off (a diagnostic for its TTFT)",
    )
    args = parser.parse_args()
    from sglang_peer import find_peer

    work = Path(tempfile.mkdtemp(prefix="bench-parity-"))
    peer, why = find_peer(args.peer_python, work)
    if peer is None:
        print(f"SGLang's bench_serving is not available: {why}")
        return 2
    levels = [int(x) for x in args.concurrency.split(",") if x]
    port = _free_port()
    twin = _start_twin(port, args.pace, work)
    url = f"http://127.0.0.1:{port}"
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    try:
        for r in range(args.repeats):
            for level in levels:
                order = ["bench_serving", "compat", "send"] + (["bench_serving_gc_off"] if args.explain_gc else [])
                if r % 2:
                    order.reverse()
                for who in order:
                    out = work / f"{who}-c{level}-r{r}.jsonl"
                    seed = 100 + r
                    if who.startswith("bench_serving"):
                        record = _peer(peer, url, level, args, seed, out, gc_off=who.endswith("gc_off"))
                    else:
                        record = _dsv4lab(url, level, args, seed, out, compat=who == "compat")
                    runs.setdefault((who, level), []).append(record)
                    print(
                        f"repeat {r + 1} c={level} {who:<20} out tok/s {record['output_throughput']:8.2f}  "
                        f"TTFT mean {record['mean_ttft_ms']:8.2f} ms",
                        flush=True,
                    )
    finally:
        _stop_twin(twin)

    print()
    print(
        f"twin: Config A, rtx-pro-6000-x8, SGLang 0.5.23 syntax, paced at {args.pace:g} "
        "(bench_serving scaled to modelled time); workload "
        f"{args.num_prompts} prompts, {args.input_len} in / {args.output_len} out (fixed), /generate; "
        f"{args.repeats} alternating repeats"
    )
    for level in levels:
        theirs = runs[("bench_serving", level)]
        pairs = [
            ("compat", "dsv4lab --ttft-clock connect --itl-unit token", theirs),
            ("send", "dsv4lab, defaults", theirs),
        ]
        if args.explain_gc:
            pairs.append(("bench_serving_gc_off", "bench_serving with its GC off", theirs))
            pairs.append(("compat", "dsv4lab compatible mode", runs[("bench_serving_gc_off", level)]))
        for who, title, base in pairs:
            ours = runs[(who, level)]
            versus = "bench_serving 0.5.23" if base is theirs else "bench_serving 0.5.23 with its GC off"
            print(f"concurrency {level}: {title} / {versus}")
            print(f"  {'metric':<22} {'bench_serv':>11} {'dsv4lab':>11} {'ratio':>8}   per repeat")
            for metric in METRICS:
                line = _ratio_line(
                    metric, [float(x[metric]) for x in ours], [float(x[metric]) for x in base], who == "compat"
                )
                print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
