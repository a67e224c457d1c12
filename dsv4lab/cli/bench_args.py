"""The options of ``dsv4lab bench`` and their translation into workloads, loads and client options.

Names follow SGLang's ``bench_serving`` wherever the meaning is the same (``--max-concurrency``,
``--random-input-len``, ``--output-file``, ``--flush-cache``, ...), usually beside dsv4lab's shorter
original name; where ``bench_serving`` and ``dsv4lab launch`` disagree, ``launch`` wins, because one
command line should not give a word two meanings: ``--host`` is the SSH host (as in ``launch``), ``--run-dir``
the server's run directory. Every check here raises :class:`~dsv4lab.errors.ConfigError` naming the option
and what it accepts (exit status 2), before anything is sent.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

from dsv4lab.bench.client import ClientOptions
from dsv4lab.bench.metrics import SLO
from dsv4lab.bench.workload import (
    NO_CAP,
    LoadSpec,
    Workload,
    cap_levels,
    random_workload,
    shared_prefix_workload,
    sharegpt_workload,
)
from dsv4lab.cli.argparsing import ArgumentParser, add_host_options
from dsv4lab.errors import BenchError, ConfigError

__all__ = ["API_OF_BACKEND", "build_parser", "client_options", "levels", "load_spec", "slo", "workload_factory"]

#: ``bench_serving --backend`` names and the API each speaks.
API_OF_BACKEND = {
    "sglang": "generate",
    "sglang-native": "generate",
    "sglang-oai": "completions",
    "sglang-oai-chat": "chat",
    "vllm": "completions",
    "vllm-chat": "chat",
    "lmdeploy": "completions",
    "lmdeploy-chat": "chat",
}

#: Datasets: dsv4lab's random prompts stand for both of bench_serving's random kinds (prompts of the
#: asked token lengths; see :func:`~dsv4lab.bench.workload.random_workload`).
DATASETS = ("random", "random-ids", "sharegpt", "generated-shared-prefix")
_GSP = ("gsp_num_groups", "gsp_prompts_per_group", "gsp_system_prompt_len", "gsp_question_len", "gsp_output_len")
#: bench_serving's defaults for the shared-prefix workload.
_GSP_DEFAULTS = {
    "gsp_num_groups": 64,
    "gsp_prompts_per_group": 16,
    "gsp_system_prompt_len": 2048,
    "gsp_question_len": 128,
    "gsp_output_len": 256,
}
DEFAULT_INPUT_LEN, DEFAULT_OUTPUT_LEN = 1024, 128


def build_parser(prog: str = "dsv4lab bench") -> argparse.ArgumentParser:
    """``dsv4lab bench``'s options, with ``bench_serving``'s names accepted beside dsv4lab's where they mean the
    same, so a command line written for SGLang's client runs here unchanged."""
    p = ArgumentParser(
        prog=prog,
        description="Benchmark a running SGLang (or OpenAI-compatible) server: by URL, or by the run directory "
        "'dsv4lab launch' made (over an SSH tunnel with --host). Options named as in SGLang's bench_serving mean "
        "what they mean there; docs/benchmarks.md lists where dsv4lab differs.",
    )
    for add_group in (
        _server_options,
        _workload_options,
        _load_options,
        _request_options,
        _metric_options,
        _output_options,
    ):
        add_group(p)
    return p


def _server_options(p: argparse.ArgumentParser) -> None:
    srv = p.add_argument_group("server")
    srv.add_argument("--url", "--base-url", dest="url", help="server base URL this machine reaches")
    srv.add_argument("--port", type=int, help="server port (on --host through an SSH tunnel, else on this machine)")
    srv.add_argument("--run-dir", help="the server's run directory, as given to 'dsv4lab launch' (port from it)")

    add_host_options(p)  # the same --host/--known-hosts/--trust-host-key as launch
    srv.add_argument(
        "--ready-check-timeout-sec", type=float, default=0.0, help="wait up to S for GET /v1/models (default 0: no)"
    )


def _workload_options(p: argparse.ArgumentParser) -> None:
    wl = p.add_argument_group("workload")
    wl.add_argument("--dataset-name", choices=DATASETS, help="random (default) or sharegpt with --dataset-path")
    wl.add_argument("--dataset-path", "--dataset", dest="dataset_path", help="a ShareGPT-style JSON file")
    wl.add_argument("--num-prompts", type=int, help="requests per run (default: max(10, 5 x concurrency); 50 uncapped)")
    wl.add_argument("--input-len", "--random-input-len", dest="input_len", type=int, help="prompt tokens (1024)")
    wl.add_argument(
        "--output-len", "--random-output-len", dest="output_len", type=int, help="output tokens (128; fixes ShareGPT's)"
    )
    wl.add_argument(
        "--range-ratio", "--random-range-ratio", dest="range_ratio", type=float, help="lengths in [len*ratio, len] (1)"
    )
    wl.add_argument("--token-ids", "--tokenize-prompt", dest="token_ids", action="store_true", help="send token ids")
    wl.add_argument(
        "--no-server-tokenizer",
        dest="server_tokenizer",
        action="store_false",
        help="send the client's word prompts, not ones fitted with the server's /tokenize",
    )
    wl.add_argument("--sharegpt-output-len", type=int, help="fixed output length for ShareGPT prompts")
    wl.add_argument("--sharegpt-context-len", type=int, help="drop ShareGPT requests with prompt + output above N")
    for name in _GSP:
        flag = "--" + name.replace("_", "-")
        wl.add_argument(flag, type=int, dest=name, help=f"generated-shared-prefix (default {_GSP_DEFAULTS[name]})")
    wl.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default 0)")


def _load_options(p: argparse.ArgumentParser) -> None:
    ld = p.add_argument_group("load")
    ld.add_argument(
        "--concurrency",
        "--max-concurrency",
        dest="concurrency",
        help="levels, e.g. 1,16; inf = no cap (default 1, or no cap with --request-rate)",
    )
    ld.add_argument("--request-rate", type=float, default=math.inf, help="requests/s, Poisson (default inf)")
    ld.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of arrivals (1 = Poisson)")
    ld.add_argument("--warmup", "--warmup-requests", dest="warmup", type=int, default=1, help="uncounted (default 1)")
    ld.add_argument("--repeats", type=int, default=1, help="runs per concurrency level (default 1)")
    ld.add_argument("--flush-cache", action="store_true", help="flush the server's prefix cache after the warmup")


def _request_options(p: argparse.ArgumentParser) -> None:
    rq = p.add_argument_group("requests")
    apis = ("generate", "completions", "chat")
    rq.add_argument("--api", choices=apis, help="endpoint (default: completions on vLLM, else generate)")
    rq.add_argument("--backend", choices=sorted(API_OF_BACKEND), help="bench_serving's name for --api")
    rq.add_argument("--model", help="model name for OpenAI APIs (default: first id of /v1/models)")
    rq.add_argument("--disable-stream", action="store_true", help="one response body per request (TTFT = E2E)")
    rq.add_argument("--disable-ignore-eos", action="store_true", help="let the model stop at EOS")
    rq.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0)")
    rq.add_argument("--top-p", type=float, help="nucleus sampling (default: the server's)")
    rq.add_argument("--extra-request-body", metavar="JSON", help="a JSON object merged into every request body")
    rq.add_argument("--header", nargs="+", default=[], metavar="KEY=VALUE", help="extra HTTP headers")
    rq.add_argument("--api-key", default=None, help="Bearer token (default: $OPENAI_API_KEY)")
    rq.add_argument("--request-timeout", type=float, default=600.0, help="seconds per request (default 600)")


def _metric_options(p: argparse.ArgumentParser) -> None:
    mt = p.add_argument_group("metrics")
    mt.add_argument(
        "--ttft-clock",
        choices=("send", "connect"),
        default="send",
        help="start each request's clock when its bytes are sent on an open connection (send, default) or "
        "before encoding and connecting, as bench_serving does (connect)",
    )
    mt.add_argument(
        "--itl-unit",
        choices=("chunk", "token"),
        default="chunk",
        help="one ITL per chunk gap (default) or each gap split over its tokens, as bench_serving on /generate",
    )
    mt.add_argument(
        "--stamp-chunks",
        choices=("text", "choice"),
        default="text",
        help="time only the chunks that carry text (default, as bench_serving) or every chunk with a choice, "
        "text or not, as vllm bench serve (a token that decodes to nothing yet still arrived)",
    )
    mt.add_argument("--goodput", nargs="+", metavar="KEY:MS", help="SLOs: ttft:500 tpot:50 e2el:20000")
    mt.add_argument("--slo-ttft-ms", type=float, help="goodput SLO on TTFT")
    mt.add_argument("--slo-tpot-ms", type=float, help="goodput SLO on TPOT")
    mt.add_argument("--slo-e2e-ms", type=float, help="goodput SLO on E2E latency")
    mt.add_argument("--profile", action="store_true", help="torch-profile the server over the measured requests")
    mt.add_argument("--profile-output-dir", help="trace directory on the server host (default: the server's)")


def _output_options(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument("--results-dir", help="append every result to RESULTS_DIR/bench_results.jsonl")
    out.add_argument("--output-file", help="append bench_serving's JSONL object per run (dsv4lab's under 'dsv4lab')")
    out.add_argument("--output-details", action="store_true", help="per-request lists in --output-file")
    out.add_argument("--label", "--tag", dest="label", default="", help="label stored with the results")
    out.add_argument("--format", choices=("table", "json", "sglang"), default="table", help="what to print")
    out.add_argument("--json", action="store_true", help="same as --format json: one JSON object per run")
    out.add_argument("--no-progress", "--disable-tqdm", dest="no_progress", action="store_true", help="no progress")


def _given(args: argparse.Namespace, *names: str) -> list[str]:
    return ["--" + n.replace("_", "-") for n in names if getattr(args, n, None) not in (None, False, [])]


def levels(args: argparse.Namespace) -> list[int | None]:
    """Concurrency levels; without ``--concurrency`` one level: 1, or no cap when a request rate is given."""
    if args.concurrency is None:
        return [None] if math.isfinite(args.request_rate) else [1]
    try:
        found = cap_levels(str(args.concurrency))
    except BenchError:
        raise ConfigError(
            "--concurrency", args.concurrency, f"integers >= 1 separated by commas, or {'/'.join(NO_CAP)} for no cap"
        ) from None
    return list(dict.fromkeys(found))  # each level once, in the order given


def dataset_of(args: argparse.Namespace) -> str:
    if args.dataset_path and args.dataset_name not in (None, "sharegpt"):
        raise ConfigError("--dataset-path", args.dataset_path, "a ShareGPT file, only with --dataset-name sharegpt")
    if args.dataset_name == "sharegpt" and not args.dataset_path:
        raise ConfigError("--dataset-name", "sharegpt", "needs --dataset-path FILE (nothing is downloaded)")
    if args.dataset_path:
        return "sharegpt"
    return "random" if args.dataset_name in (None, "random", "random-ids") else str(args.dataset_name)


def workload_factory(args: argparse.Namespace) -> Callable[[int | None], Workload]:
    """A function of the concurrency level giving the workload; every option that does not apply to the
    chosen dataset is refused instead of ignored."""
    kind = dataset_of(args)
    for name in ("num_prompts", "input_len", "output_len", "sharegpt_output_len", "sharegpt_context_len", *_GSP):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ConfigError("--" + name.replace("_", "-"), value, "an integer >= 1")
    if args.range_ratio is not None and not 0 <= args.range_ratio <= 1:
        raise ConfigError("--range-ratio", args.range_ratio, "a number between 0 and 1")
    if kind != "generated-shared-prefix" and (bad := _given(args, *_GSP)):
        raise ConfigError(bad[0], getattr(args, bad[0][2:].replace("-", "_")), "only with the shared-prefix dataset")
    if kind != "sharegpt" and (bad := _given(args, "sharegpt_output_len", "sharegpt_context_len")):
        raise ConfigError(bad[0], getattr(args, bad[0][2:].replace("-", "_")), "only with --dataset-path (ShareGPT)")
    if kind != "random" and not args.server_tokenizer:
        raise ConfigError("--no-server-tokenizer", True, "only with random prompts")
    if kind != "random" and (bad := _given(args, "input_len", "range_ratio", "token_ids")):
        raise ConfigError(bad[0], getattr(args, bad[0][2:].replace("-", "_")), "only with random prompts")

    def count(level: int | None) -> int:
        if args.num_prompts is not None:
            return int(args.num_prompts)
        return 50 if level is None else max(10, 5 * level)

    if kind == "sharegpt":
        out_len = args.sharegpt_output_len
        if args.output_len is not None:
            if out_len is not None and out_len != args.output_len:
                raise ConfigError("--output-len", args.output_len, f"the same as --sharegpt-output-len ({out_len})")
            out_len = args.output_len
        ctx = args.sharegpt_context_len
        caps: dict[str, Any] = {} if ctx is None else {"max_prompt_len": ctx, "max_output_len": ctx, "context_len": ctx}
        try:  # the file is read now, so a wrong one is refused before anything is sent
            sharegpt_workload(args.dataset_path, 1, output_len=out_len, seed=args.seed, **caps)
        except BenchError as exc:
            raise ConfigError(
                "--dataset-path",
                args.dataset_path,
                'a ShareGPT JSON list of {"conversations": [{"from": ..., "value": ...}, ...]} with at least one '
                "prompt and reply that fit",
                detail=str(exc),
            ) from None
        return lambda level: sharegpt_workload(
            args.dataset_path, count(level), output_len=out_len, seed=args.seed, **caps
        )
    if kind == "generated-shared-prefix":
        if args.num_prompts is not None:
            raise ConfigError(
                "--num-prompts", args.num_prompts, "not with the shared-prefix dataset (it sends groups x prompts)"
            )
        if args.output_len is not None and args.gsp_output_len is not None and args.output_len != args.gsp_output_len:
            raise ConfigError("--output-len", args.output_len, f"the same as --gsp-output-len ({args.gsp_output_len})")
        g = {k: getattr(args, k) if getattr(args, k) is not None else v for k, v in _GSP_DEFAULTS.items()}
        out = args.output_len if args.output_len is not None else g["gsp_output_len"]
        wl = shared_prefix_workload(
            g["gsp_num_groups"],
            g["gsp_prompts_per_group"],
            g["gsp_system_prompt_len"],
            g["gsp_question_len"],
            out,
            seed=args.seed,
        )
        return lambda level: wl
    return lambda level: random_workload(
        count(level),
        args.input_len if args.input_len is not None else DEFAULT_INPUT_LEN,
        args.output_len if args.output_len is not None else DEFAULT_OUTPUT_LEN,
        range_ratio=args.range_ratio if args.range_ratio is not None else 1.0,
        seed=args.seed,
        token_ids=args.token_ids,
        server_tokenizer=args.server_tokenizer,
    )


def _headers(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--header", item, "KEY=VALUE, e.g. --header X-Team=infra")
        out[key.strip()] = value
    return out


def client_options(args: argparse.Namespace) -> ClientOptions:
    """The client settings the parsed options ask for, checked together (``--backend`` and ``--api`` must
    agree) before any request is sent."""
    api = args.api
    if args.backend is not None:
        if api is not None and api != API_OF_BACKEND[args.backend]:
            raise ConfigError("--backend", args.backend, f"a backend speaking --api {api}, or no --api")
        api = API_OF_BACKEND[args.backend]
    extra: dict[str, Any] = {}
    if args.extra_request_body:
        try:
            extra = json.loads(args.extra_request_body)
        except ValueError as exc:
            raise ConfigError(
                "--extra-request-body", args.extra_request_body, "a JSON object", detail=str(exc)
            ) from None
        if not isinstance(extra, dict):
            raise ConfigError("--extra-request-body", args.extra_request_body, "a JSON object like '{\"top_k\": 20}'")
    if api == "chat" and args.token_ids:
        raise ConfigError("--token-ids", True, "not with the chat API (it takes text messages)")
    if args.output_details and not args.output_file:
        raise ConfigError("--output-details", True, "only with --output-file (it adds per-request lists there)")
    try:
        return ClientOptions(
            api=api or "generate",
            model=args.model,
            ignore_eos=not args.disable_ignore_eos,
            temperature=args.temperature,
            top_p=args.top_p,
            stream=not args.disable_stream,
            extra_body=extra,
            headers=_headers(args.header),
            api_key=args.api_key if args.api_key is not None else (os.environ.get("OPENAI_API_KEY") or None),
            request_timeout_s=args.request_timeout,
            record_text=args.output_details,
            ttft_clock=args.ttft_clock,
            itl_unit=args.itl_unit,
            stamp_chunks=args.stamp_chunks,
        )
    except BenchError as exc:
        raise ConfigError("request options", "", str(exc)) from None


def load_spec(args: argparse.Namespace, first_level: int | None) -> LoadSpec:
    """The load the parsed options ask for at concurrency ``first_level``; bad values are refused here, naming
    the option, before the server is contacted."""
    if args.warmup < 0:
        raise ConfigError("--warmup", args.warmup, "an integer >= 0")
    if args.repeats < 1:
        raise ConfigError("--repeats", args.repeats, "an integer >= 1")
    try:
        return LoadSpec(
            concurrency=first_level,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            warmup=args.warmup,
            seed=args.seed,
            flush_cache=args.flush_cache,
        )
    except BenchError as exc:
        raise ConfigError("load options", "", str(exc)) from None


def slo(args: argparse.Namespace) -> SLO | None:
    """The goodput SLOs from ``--goodput ttft:MS tpot:MS e2el:MS`` (bench_serving) or ``--slo-*-ms``."""
    values = {"ttft": args.slo_ttft_ms, "tpot": args.slo_tpot_ms, "e2el": args.slo_e2e_ms}
    for item in args.goodput or ():
        key, _, ms = item.partition(":")
        try:
            limit = float(ms)
        except ValueError:
            limit = math.nan
        if key not in values or not (math.isfinite(limit) and limit > 0):
            raise ConfigError("--goodput", item, "KEY:MS with KEY ttft, tpot or e2el and MS > 0, e.g. ttft:500")
        if values[key] is not None and values[key] != limit:
            raise ConfigError("--goodput", item, f"one value per SLO ({key} is also set to {values[key]:g})")
        values[key] = limit
    if all(v is None for v in values.values()):
        return None
    return SLO(values["ttft"], values["tpot"], values["e2el"])
