"""Benchmarks of a running server: the built-in streaming client, SGLang's own client run remotely,
result storage with provenance, and A/B verdicts with confidence intervals.

========================  =========================================================================
``workload``              what is sent (random, ShareGPT, shared-prefix prompts) and how it arrives
``sse``                   incremental Server-Sent Events parsing
``httpstream``            the minimal HTTP/1.1 streaming transport (timestamps at the socket read)
``client``                one request on /generate, /v1/completions or /v1/chat/completions; the clock
                          (``send``, or ``connect``: bench_serving's, on an aiohttp session per request)
``metrics``               per-request records and SGLang's metric definitions
``runner``, ``death``     a run, a concurrency sweep; deciding that the server died mid-run
``serverinfo``            side requests: provenance, readiness, cache flush, profiling
``results``, ``store``    BenchResult with provenance and definitions; the append-only JSONL store
``sglang_format``         bench_serving's JSONL object and printed block for a BenchResult
``remote``                SGLang's bench_serving on the server host, parsed into a BenchResult
``stats`` (was            Welch CIs and verdicts; interleaved A/B runs
``compare``), ``ab``
``cli``, ``cliargs``      ``dsv4lab bench`` (bench_serving's option names where they mean the same)
========================  =========================================================================

Typical use::

    from dsv4lab import bench
    wl = bench.random_workload(64, input_len=1024, output_len=128, seed=1)
    results = bench.sweep("http://127.0.0.1:30000", wl, [1, 16], repeats=3, store="runs/a")
"""

from __future__ import annotations

from dsv4lab.bench.ab import ABRuns, ab_schedule, run_ab, run_ab_async
from dsv4lab.bench.client import ClientOptions
from dsv4lab.bench.metrics import SLO, Distribution, RequestRecord, Summary, summarize
from dsv4lab.bench.remote import parse_jsonl, parse_stdout, run_remote
from dsv4lab.bench.results import BenchResult, BenchRuns, Provenance, ServerContext
from dsv4lab.bench.runner import run, run_async, sweep, sweep_async
from dsv4lab.bench.sglang_format import bench_serving_record, serving_block
from dsv4lab.bench.stats import ABComparison, ABLevel, compare, t_quantile, verdict_for, welch
from dsv4lab.bench.store import ResultStore
from dsv4lab.bench.workload import (
    LoadSpec,
    RequestSpec,
    Workload,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
)
from dsv4lab.errors import BenchError, RemoteBenchError

__all__ = [
    "SLO",
    "ABComparison",
    "ABLevel",
    "ABRuns",
    "BenchError",
    "BenchResult",
    "BenchRuns",
    "ClientOptions",
    "Distribution",
    "LoadSpec",
    "Provenance",
    "RemoteBenchError",
    "RequestRecord",
    "RequestSpec",
    "ResultStore",
    "ServerContext",
    "Summary",
    "Workload",
    "ab_schedule",
    "bench_serving_record",
    "compare",
    "parse_jsonl",
    "parse_stdout",
    "random_workload",
    "run",
    "run_ab",
    "run_ab_async",
    "run_async",
    "run_remote",
    "serving_block",
    "shared_prefix_workload",
    "sharegpt_workload",
    "summarize",
    "sweep",
    "sweep_async",
    "t_quantile",
    "verdict_for",
    "welch",
]
