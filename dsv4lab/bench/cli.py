"""``dsv4lab bench``: benchmark a running server from the shell.

``bench_main(argv)`` is the whole command (the top-level CLI only forwards to it). With ``--json`` it prints
JSON Lines: one object per run (one per concurrency level, times ``--repeats``), each with at least
``concurrency``, ``completed``, ``failed``, ``output_throughput``, ``request_throughput`` and ``ttft_ms`` /
``tpot_ms`` / ``itl_ms`` / ``e2e_ms`` as ``{mean, median, p90, p99, std, count}``. Without it, a table.
Exit status: 0 when every run completed, 1 when a run was cut short by the server dying or had failed
requests, 2 for a usage error (one ``Error: ...`` line).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

from dsv4lab.bench.client import ENDPOINTS, ClientOptions
from dsv4lab.bench.metrics import SLO
from dsv4lab.bench.results import BenchResult
from dsv4lab.bench.runner import run_sync, sweep_async
from dsv4lab.bench.workload import LoadSpec, Workload, concurrency_levels, random_workload, sharegpt_workload
from dsv4lab.errors import DSV4LabError

__all__ = ["bench_main", "build_parser"]


def build_parser(prog: str = "dsv4lab bench") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="Benchmark a running SGLang (or OpenAI-compatible) server.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--concurrency", default="1", help="comma-separated levels, e.g. 1,2,4,8,16 (default 1)")
    p.add_argument("--num-prompts", type=int, help="requests per run (default: max(10, 5 x concurrency))")
    p.add_argument("--input-len", type=int, default=1024, help="prompt length in tokens (default 1024)")
    p.add_argument("--output-len", type=int, default=128, help="output length in tokens (default 128)")
    p.add_argument("--range-ratio", type=float, default=1.0, help="lengths uniform in [len*ratio, len] (default 1)")
    p.add_argument("--dataset", help="a ShareGPT-style JSON file instead of random prompts")
    p.add_argument("--token-ids", action="store_true", help="send token ids (exact prompt lengths)")
    p.add_argument("--api", choices=sorted(ENDPOINTS), default="completions", help="endpoint (default completions)")
    p.add_argument("--model", help="model name for OpenAI APIs (default: first id of /v1/models)")
    p.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (default inf)")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals (1 = Poisson)")
    p.add_argument("--warmup", type=int, default=1, help="warmup requests per run, not counted (default 1)")
    p.add_argument("--repeats", type=int, default=1, help="runs per concurrency level (default 1)")
    p.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default 0)")
    p.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")
    p.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT")
    p.add_argument("--slo-e2e-ms", type=float, help="goodput SLO on E2E latency")
    p.add_argument("--run-dir", help="append every result to RUN_DIR/bench_results.jsonl")
    p.add_argument("--label", default="", help="label stored with the results")
    p.add_argument("--json", action="store_true", help="JSON Lines: one object per run")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def _table(results: Sequence[BenchResult]) -> str:
    head = (
        f"{'conc':>5} {'ok':>5} {'fail':>5} {'req/s':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
        f"{'TPOT med':>9} {'ITL p99':>9} {'E2E med':>9}  note"
    )
    lines = [head]
    for r in results:
        s = r.summary
        conc = "inf" if r.concurrency is None else str(r.concurrency)
        note = f"PARTIAL: {r.abort_reason}" if r.partial else ""
        lines.append(
            f"{conc:>5} {s.completed:>5} {s.failed + s.incomplete + s.not_sent:>5} {s.request_throughput:>8.3f} "
            f"{s.output_throughput:>10.1f} {s.ttft_ms.median:>9.1f} {s.ttft_ms.p99:>9.1f} {s.tpot_ms.median:>9.2f} "
            f"{s.itl_ms.p99:>9.2f} {s.e2e_ms.median:>9.1f}  {note}"
        )
    lines.append("latencies in ms; fail = failed + incomplete + not sent")
    return "\n".join(lines)


def bench_main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        levels = concurrency_levels(args.concurrency)

        def workload_for(level: int) -> Workload:
            n = args.num_prompts or max(10, 5 * level)
            if args.dataset:
                return sharegpt_workload(args.dataset, n, seed=args.seed)
            return random_workload(
                n,
                args.input_len,
                args.output_len,
                range_ratio=args.range_ratio,
                seed=args.seed,
                token_ids=args.token_ids,
            )

        options = ClientOptions(api=args.api, model=args.model, request_timeout_s=args.request_timeout)
        load = LoadSpec(
            concurrency=levels[0],
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            warmup=args.warmup,
            seed=args.seed,
        )
        slo = None
        if any(x is not None for x in (args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)):
            slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
        results = run_sync(
            sweep_async(
                args.url,
                workload_for,
                levels,
                repeats=args.repeats,
                load=load,
                options=options,
                slo=slo,
                label=args.label,
                progress=not args.no_progress and not args.json,
                store=args.run_dir,
            )
        )
    except DSV4LabError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for r in results:
            print(json.dumps(r.row(), allow_nan=False), flush=True)
    else:
        print(_table(results))
    bad = any(r.partial or r.summary.completed < r.summary.total for r in results)
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(bench_main())
