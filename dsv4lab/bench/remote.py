"""The remote backend: SGLang's own benchmark run on the server host, read back as a BenchResult.

Running the engine's own client next to the server is the cross-check a skeptical reader asks for ("is it
your client?") and removes the SSH tunnel from the measurement. The same Workload and LoadSpec are
translated into its flags (the module is ``sglang.bench_serving`` up to 0.5.16 and
``sglang.benchmark.serving`` in 0.5.23, from :mod:`dsv4lab.config.versions`); its JSON Lines output (one object
per run, ``--output-details`` adding per-request lists) and its printed result block are parsed into the
same result type as the built-in client's.

What does not carry over, and is said so in the result: SGLang builds its own prompts from the workload's
lengths and seed (``random-ids`` for random workloads, because its ``random`` dataset downloads ShareGPT),
it has no client queue-time measurement (``queue_ms`` is empty), and per-request E2E latency is rebuilt as
TTFT + ΣITL (its ITLs split each chunk gap over the chunk's tokens, which keeps the sum).
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import re
import shlex
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dsv4lab.atomicfile import to_jsonable
from dsv4lab.bench.client import ClientOptions
from dsv4lab.bench.metrics import Distribution, Summary
from dsv4lab.bench.results import REQUEST_COLUMNS, BenchResult, Provenance
from dsv4lab.bench.serverinfo import engine_of, gpu_names
from dsv4lab.bench.workload import LoadSpec, Workload
from dsv4lab.config.server_config import ServerConfig
from dsv4lab.config.versions import resolve_release
from dsv4lab.errors import Interrupted, RemoteBenchError
from dsv4lab.hosts import CommandResult, Host

__all__ = ["build_argv", "parse_jsonl", "parse_stdout", "remote_result", "run_remote"]

#: The benchmark module of SGLang 0.5.16 and later (``--temperature``, ``--top-p`` and ``--header`` exist there).
NEW_MODULE = "sglang.benchmark.serving"

#: SGLang ``--backend`` for each built-in API.
BACKENDS = {"completions": "sglang-oai", "chat": "sglang-oai-chat", "generate": "sglang"}

_BLOCK_START = re.compile(r"^=+\s*Serving Benchmark Result\s*=+\s*$")
_BLOCK_END = re.compile(r"^=+\s*$")
_VALUE_LINE = re.compile(r"^(?P<label>[^:]+?):\s+(?P<value>\S.*?)\s*$")


def build_argv(
    *,
    python: Sequence[str],
    module: str,
    base_url: str,
    workload: Workload,
    load: LoadSpec,
    options: ClientOptions,
    output_file: str,
    dataset_path: str | None = None,
    tokenizer: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """SGLang's benchmark command line for this workload and load."""
    argv = [*python, "-m", module, "--backend", BACKENDS[options.api], "--base-url", base_url]
    argv += ["--num-prompts", str(len(workload)), "--seed", str(workload.seed)]
    argv += _dataset_args(workload, dataset_path)
    argv += _load_args(load)
    if options.model:
        argv += ["--model", options.model]
    if tokenizer:
        argv += ["--tokenizer", tokenizer]
    argv += _request_args(options, module)
    if load.flush_cache:
        argv.append("--flush-cache")
    if options.extra_body:
        argv += ["--extra-request-body", json.dumps(dict(options.extra_body))]
    argv += ["--output-file", output_file, "--output-details", "--disable-tqdm", *extra_args]
    return argv


def _dataset_args(workload: Workload, dataset_path: str | None) -> list[str]:
    """bench_serving's dataset for each kind of workload dsv4lab generates (it has no other)."""
    p = workload.params
    match p.get("kind"):
        case "random":
            return [
                "--dataset-name",
                "random-ids",
                "--random-input-len",
                str(p["input_len"]),
                "--random-output-len",
                str(p["output_len"]),
                "--random-range-ratio",
                repr(float(p["range_ratio"])),
            ]
        case "shared_prefix":
            return [
                "--dataset-name",
                "generated-shared-prefix",
                "--gsp-num-groups",
                str(p["num_groups"]),
                "--gsp-prompts-per-group",
                str(p["prompts_per_group"]),
                "--gsp-system-prompt-len",
                str(p["prefix_len"]),
                "--gsp-question-len",
                str(p["suffix_len"]),
                "--gsp-output-len",
                str(p["output_len"]),
            ]
        case "sharegpt":
            if dataset_path is None:
                raise RemoteBenchError("a ShareGPT workload needs the dataset file on the host (dataset_path)")
            argv = ["--dataset-name", "sharegpt", "--dataset-path", dataset_path]
            if p.get("output_len") is not None:
                argv += ["--sharegpt-output-len", str(p["output_len"])]
            if p.get("context_len") is not None:
                argv += ["--sharegpt-context-len", str(p["context_len"])]
            return argv
        case kind:
            raise RemoteBenchError(f"SGLang's benchmark cannot reproduce a {kind!r} workload")


def _load_args(load: LoadSpec) -> list[str]:
    if load.burstiness != 1.0:
        raise RemoteBenchError("SGLang's benchmark client has Poisson arrivals only (burstiness 1.0)")
    argv = ["--request-rate", "inf" if math.isinf(load.request_rate) else repr(load.request_rate)]
    if load.concurrency is not None:
        argv += ["--max-concurrency", str(load.concurrency)]
    return [*argv, "--warmup-requests", str(load.warmup)]


def _request_args(options: ClientOptions, module: str) -> list[str]:
    """EOS, streaming, sampling and headers; what the old module lacks, and an API key on the command line,
    are refused."""
    argv = []
    if not options.ignore_eos:
        argv.append("--disable-ignore-eos")
    if not options.stream:
        argv.append("--disable-stream")
    sampling = {"--temperature": options.temperature != 0.0, "--top-p": options.top_p is not None}
    missing = [flag for flag, wanted in (*sampling.items(), ("--header", bool(options.headers))) if wanted]
    if missing and module != NEW_MODULE:
        raise RemoteBenchError(f"{module} (SGLang before 0.5.16) has no {', '.join(missing)}; use a newer release")
    if options.temperature != 0.0:
        argv += ["--temperature", repr(float(options.temperature))]
    if options.top_p is not None:
        argv += ["--top-p", repr(float(options.top_p))]
    if options.headers:
        argv += ["--header", *(f"{k}={v}" for k, v in options.headers.items())]
    if options.api_key:
        raise RemoteBenchError(
            "SGLang's benchmark reads the API key from OPENAI_API_KEY in its environment; set it on the host "
            "instead of passing it on a command line other users can read"
        )
    return argv


def parse_stdout(text: str) -> dict[str, float | str]:
    """The ``Serving Benchmark Result`` block: label (without the colon) -> number, or the text as printed
    (``not set``, ``inf``). The last block in ``text`` wins; section headers (``---TTFT---``) are skipped."""
    blocks: list[dict[str, float | str]] = []
    current: dict[str, float | str] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        if _BLOCK_START.match(line):
            current = {}
            continue
        if current is None:
            continue
        if _BLOCK_END.match(line):
            blocks.append(current)
            current = None
            continue
        m = _VALUE_LINE.match(line)
        if not m or line.startswith("-"):
            continue
        value = m.group("value")
        try:
            current[m.group("label").strip()] = float(value)
        except ValueError:
            current[m.group("label").strip()] = value
    if current:
        blocks.append(current)
    if not blocks:
        raise RemoteBenchError("no 'Serving Benchmark Result' block in SGLang's output")
    return blocks[-1]


def parse_jsonl(text: str) -> dict[str, Any]:
    """The last complete JSON object of SGLang's ``--output-file`` (it appends one per run)."""
    last: dict[str, Any] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            last = obj
    if last is None:
        raise RemoteBenchError("SGLang's output file holds no JSON result")
    return last


def _num(obj: Mapping[str, Any], key: str) -> float:
    value = obj.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan


def _dist(obj: Mapping[str, Any], name: str, count: int) -> Distribution:
    return Distribution(
        count=count,
        mean=_num(obj, f"mean_{name}_ms"),
        median=_num(obj, f"median_{name}_ms"),
        std=_num(obj, f"std_{name}_ms"),
        p90=_num(obj, f"p90_{name}_ms"),
        p95=_num(obj, f"p95_{name}_ms"),
        p99=_num(obj, f"p99_{name}_ms"),
        min=_num(obj, f"min_{name}_ms"),
        max=_num(obj, f"max_{name}_ms"),
    )


def _details_frame(obj: Mapping[str, Any], total: int) -> pd.DataFrame:
    ins = list(obj.get("input_lens") or [])
    outs = list(obj.get("output_lens") or [])
    ttfts = list(obj.get("ttfts") or [])
    itls = list(obj.get("itls") or [])
    errors = list(obj.get("errors") or [])
    n = max(len(ins), len(outs), len(ttfts), len(errors), len(itls))
    rows = []
    for i in range(n):
        err = str(errors[i]) if i < len(errors) and errors[i] else ""
        ttft = ttfts[i] if i < len(ttfts) and isinstance(ttfts[i], (int, float)) else None
        gaps = [float(g) for g in itls[i]] if i < len(itls) and isinstance(itls[i], list) else []
        out = int(outs[i]) if i < len(outs) and isinstance(outs[i], (int, float)) else 0
        ok = not err and ttft is not None and ttft > 0
        e2e = (ttft + sum(gaps)) if ok and ttft is not None else None
        tpot = (e2e - ttft) / (out - 1) if e2e is not None and ttft is not None and out > 1 else None
        rows.append(
            {
                "index": i,
                "status": "ok" if ok else "failed",
                "scheduled_s": math.nan,
                "start_s": math.nan,
                "queue_ms": math.nan,
                "ttft_ms": ttft * 1000 if ok and ttft is not None else math.nan,
                "tpot_ms": tpot * 1000 if tpot is not None else math.nan,
                "e2e_ms": e2e * 1000 if e2e is not None else math.nan,
                "itl_ms": [g * 1000 for g in gaps],
                "prompt_tokens": int(ins[i]) if i < len(ins) else 0,
                "output_tokens": out,
                "prompt_tokens_from_server": False,
                "output_tokens_from_server": True,
                "http_status": None,
                "error": err or ("" if ok else "no output"),
            }
        )
    frame: pd.DataFrame = pd.DataFrame(rows, columns=list(REQUEST_COLUMNS))
    return frame


def remote_result(
    obj: Mapping[str, Any],
    *,
    total: int,
    provenance: Provenance,
    concurrency: int | None,
    request_rate: float,
    repeat: int = 0,
    label: str = "",
    stdout_block: Mapping[str, float | str] | None = None,
) -> BenchResult:
    """A BenchResult from SGLang's JSONL object (``total`` = prompts sent; the rest failed)."""
    completed = int(_num(obj, "completed")) if not math.isnan(_num(obj, "completed")) else 0
    frame = _details_frame(obj, total)
    failed = max(0, total - completed)
    itl_count = sum(len(x) for x in frame["itl_ms"]) if len(frame) else completed
    tpot_count = int(frame["tpot_ms"].notna().sum()) if len(frame) else completed
    duration = _num(obj, "duration")
    in_tok = int(_num(obj, "total_input_tokens")) if not math.isnan(_num(obj, "total_input_tokens")) else 0
    out_tok = int(_num(obj, "total_output_tokens")) if not math.isnan(_num(obj, "total_output_tokens")) else 0
    total_tp = _num(obj, "total_throughput")
    if math.isnan(total_tp):
        total_tp = _num(obj, "input_throughput") + _num(obj, "output_throughput")
    itl = _dist(obj, "itl", itl_count)
    if stdout_block is not None and math.isnan(itl.max) and isinstance(stdout_block.get("Max ITL (ms)"), float):
        itl = dataclasses.replace(itl, max=float(stdout_block["Max ITL (ms)"]))
    accept = obj.get("accept_length")
    summary = Summary(
        total=total,
        completed=completed,
        failed=failed,
        incomplete=0,
        not_sent=0,
        duration_s=duration,
        total_input_tokens=in_tok,
        total_output_tokens=out_tok,
        request_throughput=_num(obj, "request_throughput"),
        input_throughput=_num(obj, "input_throughput"),
        output_throughput=_num(obj, "output_throughput"),
        total_throughput=total_tp,
        peak_output_throughput=_num(obj, "max_output_tokens_per_s"),
        concurrency=_num(obj, "concurrency"),
        peak_concurrent=int(_num(obj, "max_concurrent_requests")) if "max_concurrent_requests" in obj else 0,
        ttft_ms=_dist(obj, "ttft", completed),
        tpot_ms=_dist(obj, "tpot", tpot_count),
        itl_ms=itl,
        e2e_ms=_dist(obj, "e2e_latency", completed),
        queue_ms=Distribution.of([]),
        output_tokens_from_server=True,
        accept_length=float(accept) if isinstance(accept, (int, float)) else None,
    )
    return BenchResult(
        summary=summary,
        requests=frame,
        provenance=provenance,
        concurrency=concurrency,
        request_rate=request_rate,
        repeat=repeat,
        label=label,
    )


# Run "$@" with its output and exit status in files beside the results: the benchmark lives on the host
# (a dropped connection does not kill it) and can be found and killed again by its PID.
_DETACHED = (
    'out=$1; shift; "$@" > "$out.stdout" 2> "$out.stderr"; '
    'echo $? > "$out.status.tmp"; mv -f "$out.status.tmp" "$out.status"'
)

#: How often a running remote benchmark is checked for its end.
_POLL_S = 0.5


def _run_detached(host: Host, argv: Sequence[str], prefix: str, timeout_s: float, what: str) -> CommandResult:
    """Run ``argv`` detached on ``host`` and wait for it; Stop or the timeout kill its process tree.

    A blocking ``host.run`` would leave the remote benchmark running after the user's Stop (closing an
    SSH channel does not signal a process without a terminal), and SGLang's client keeps hammering the
    server for minutes.
    """
    start = time.monotonic()
    pid = host.start_detached(["bash", "-c", _DETACHED, "dsv4lab-bench", prefix, *argv], cwd=posixpath.dirname(prefix))
    try:
        while True:
            status = host.read_text(f"{prefix}.status")
            if status is not None and status.strip().lstrip("-").isdigit():
                code: int | None = int(status.strip())
                timed_out = False
                break
            if time.monotonic() - start > timeout_s:
                host.kill_tree(pid, grace_s=2.0)
                code, timed_out = None, True
                break
            time.sleep(_POLL_S)
    except KeyboardInterrupt:
        threading.Thread(target=host.kill_tree, args=(pid,), kwargs={"grace_s": 2.0}, daemon=False).start()
        raise Interrupted(
            f"{what} on {host.name}",
            elapsed_s=time.monotonic() - start,
            note="its process tree is being killed; nothing it measured is kept",
        ) from None
    out = host.read_text(f"{prefix}.stdout", max_bytes=1 << 22) or ""
    err = host.read_text(f"{prefix}.stderr", max_bytes=1 << 20) or ""
    return CommandResult(host.name, shlex.join(argv), code, out, err, time.monotonic() - start, timed_out=timed_out)


def run_remote(
    host: Host,
    base_url: str,
    workload: Workload,
    load: LoadSpec | None = None,
    options: ClientOptions | None = None,
    *,
    work_dir: str,
    sglang_version: str | None = None,
    python: Sequence[str] | str = "python3",
    tokenizer: str | None = None,
    extra_args: Sequence[str] = (),
    timeout_s: float = 3600.0,
    repeat: int = 0,
    label: str = "",
    config: ServerConfig | None = None,
) -> BenchResult:
    """Run SGLang's benchmark on ``host`` against ``base_url`` (as the host sees it, e.g.
    ``http://127.0.0.1:30000``) and return its result. ``timeout_s`` bounds the whole run."""
    load = load or LoadSpec()
    options = options or ClientOptions()
    module = resolve_release(sglang_version).bench_module
    py = shlex.split(python) if isinstance(python, str) else list(python)
    host.makedirs(work_dir, timeout_s=60.0)
    run_id = uuid.uuid4().hex[:12]
    prefix = f"{work_dir.rstrip('/')}/sglang_bench_{run_id}"
    output_file = f"{prefix}.jsonl"
    argv = build_argv(
        python=py,
        module=module,
        base_url=base_url,
        workload=workload,
        load=load,
        options=options,
        output_file=output_file,
        dataset_path=_stage_dataset(host, workload, f"{work_dir.rstrip('/')}/sharegpt_{run_id}.json"),
        tokenizer=tokenizer,
        extra_args=extra_args,
    )
    obj, block = _read_results(
        host, _run_detached(host, argv, prefix, timeout_s, module), output_file, module, timeout_s
    )
    info = obj.get("server_info") if isinstance(obj.get("server_info"), dict) else {}
    return remote_result(
        obj,
        total=len(workload),
        provenance=_remote_provenance(host, base_url, module, workload, load, options, argv, output_file, config, info),
        concurrency=load.concurrency,
        request_rate=load.request_rate,
        repeat=repeat,
        label=label,
        stdout_block=block,
    )


def _stage_dataset(host: Host, workload: Workload, dataset_path: str) -> str | None:
    """A ShareGPT workload's file, copied next to the run's outputs on the host (bench_serving reads it there)."""
    if workload.params.get("kind") != "sharegpt":
        return None
    host.put(str(workload.params["path"]), dataset_path)
    return dataset_path


def _read_results(
    host: Host, result: CommandResult, output_file: str, module: str, timeout_s: float
) -> tuple[dict[str, Any], dict[str, float | str] | None]:
    """The run's JSONL object and its printed block (None when the stdout has none); a failed run, or one
    that wrote no result file, raises with what it printed last."""
    if not result.ok:
        tail = "\n".join((result.stderr.strip() or result.stdout.strip()).splitlines()[-20:])
        what = f"timed out after {timeout_s:g} s" if result.timed_out else f"exited with status {result.exit_status}"
        raise RemoteBenchError(f"{module} on {host.name} {what}:\n{tail}")
    text = host.read_text(output_file, max_bytes=1 << 28)
    if text is None:
        raise RemoteBenchError(f"{module} wrote no result file {output_file} on {host.name}")
    obj = parse_jsonl(text)
    try:
        block: dict[str, float | str] | None = parse_stdout(result.stdout)
    except RemoteBenchError:
        block = None
    return obj, block


def _remote_provenance(
    host: Host,
    base_url: str,
    module: str,
    workload: Workload,
    load: LoadSpec,
    options: ClientOptions,
    argv: list[str],
    output_file: str,
    config: ServerConfig | None,
    info: Any,
) -> Provenance:
    engine, version = engine_of(dict(info or {}))
    return Provenance(
        url=base_url,
        backend=module,
        api=options.api,
        engine=engine,
        engine_version=version,
        host=host.name,
        gpu_names=gpu_names(host),
        workload=workload.to_dict(),
        load=load.to_dict(),
        client_options={
            **options.to_dict(),
            # bench_serving's own definitions: its clock starts before it connects and encodes; on /generate
            # it splits each chunk's gap over the chunk's tokens
            "ttft_clock": "connect",
            "itl_unit": "token" if options.api == "generate" else "chunk",
            "argv": argv,
            "output_file": output_file,
        },
        config=to_jsonable(config.to_dict()) if config is not None else None,
        server_info=to_jsonable(info or {}),
    )
