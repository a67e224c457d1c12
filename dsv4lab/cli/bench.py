"""``dsv4lab bench``: benchmark a running server from the shell.

``bench_main(argv)`` is the whole command (the top-level CLI only forwards to it). The server is named by
``--url``, by ``--port`` (on this machine, or on ``--host`` through an SSH tunnel), or by the run directory
``dsv4lab launch`` made (``--run-dir DIR [--host ALIAS]``: the port comes from the run, requests go through
the same SSH tunnel the library uses, and a server that dies mid-run is diagnosed from its log). Options are
in :mod:`.cliargs`.

Output: a table (default), ``--format json`` (``--json``: JSON Lines, one object per run — one per
concurrency level, times ``--repeats`` — each with ``concurrency``, ``completed``, ``failed``,
``output_throughput``, ``request_throughput``, ``ttft_clock`` and ``ttft_ms`` / ``tpot_ms`` / ``itl_ms`` /
``e2e_ms`` as ``{mean, median, p90, p99, std, count}``), or ``--format sglang`` (bench_serving's printed
block). ``--output-file`` appends bench_serving's JSONL objects, ``--results-dir`` dsv4lab's result store.

Exit status: 0 when every run completed; 1 when a run was cut short by the server dying or had failed
requests; 130 when stopped with Ctrl-C (the runs so far are still printed and written); otherwise the
status of the error's class (:func:`dsv4lab.errors.exit_code_for`: 2 for a bad option, 3/4 for a host that
cannot be reached or whose key is unknown, 6 for a run directory without a launch, 7 for a benchmark that
could not run), with one ``Error: ...`` line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dsv4lab.bench.client import API, ClientOptions
from dsv4lab.bench.httpstream import Endpoint
from dsv4lab.bench.results import BenchResult, BenchRuns, ServerContext
from dsv4lab.bench.runner import control_headers, run_sync, sweep_async
from dsv4lab.bench.serverinfo import engine_at, wait_until_ready
from dsv4lab.bench.sglang_format import append_jsonl, bench_serving_record, serving_block
from dsv4lab.cli.bench_args import build_parser, client_options, levels, load_spec, slo, workload_factory
from dsv4lab.errors import BenchError, ConfigError, DSV4LabError, Interrupted, exit_code_for
from dsv4lab.hosts import Host, PortForward

__all__ = ["Target", "bench_main", "build_parser", "resolve_target"]


@dataclass
class Target:
    """The server a run talks to: the URL this machine uses, and what is known of where it runs."""

    url: str
    host: Host | None = None
    handle: Any = None  # dsv4lab.serving.launch.ServerHandle when named by its run directory
    forward: PortForward | None = None

    def on_death(self) -> object:
        """What the server's log says, for a run cut short (only when the run directory is known)."""
        if self.handle is None:
            return None
        from dsv4lab.serving.watch import wait_ready

        readiness = wait_ready(self.handle, 5.0, progress=False, keep_running=True)
        return f"{readiness.verdict.value}: {readiness.reason}"

    def close(self) -> None:
        if self.forward is not None:
            self.forward.close()
        if self.host is not None:
            self.host.close()


def resolve_target(args: argparse.Namespace) -> Target:
    """``--url``, or ``--port``/``--run-dir`` on this machine or on ``--host`` through an SSH tunnel."""
    from dsv4lab.hosts import open_host

    if args.url is not None:
        for name in ("run_dir", "host", "port"):
            if getattr(args, name) is not None:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(flag, getattr(args, name), "not with --url (name the server one way)")
        try:
            return Target(Endpoint.parse(args.url).url)
        except BenchError:
            raise ConfigError("--url", args.url, "an http(s)://HOST:PORT URL this machine can reach") from None
    if args.run_dir is None and args.port is None:
        raise ConfigError("server", None, "--url URL, --port PORT, or --run-dir DIR (with --host ALIAS for SSH)")
    if args.port is not None and not 0 < args.port < 65536:
        raise ConfigError("--port", args.port, "a TCP port, 1-65535")
    host = open_host(args.host, known_hosts=args.known_hosts, trust_unknown_host=args.trust_host_key)
    target = Target("", host=host)
    try:
        port = args.port
        if args.run_dir is not None:
            from dsv4lab.serving.launch import attach

            target.handle = attach(host, args.run_dir)
            if port is not None and port != target.handle.port:
                raise ConfigError("--port", port, f"the run's own port ({target.handle.port}) or none")
            port = target.handle.port
        target.forward = target.handle.forward() if target.handle is not None else host.forward(int(port))
        target.url = target.forward.url
    except BaseException:
        target.close()
        raise
    return target


def _table(results: Sequence[BenchResult]) -> str:
    head = (
        f"{'conc':>5} {'ok':>5} {'fail':>5} {'req/s':>8} {'out tok/s':>10} {'TTFT med':>9} {'TTFT p99':>9} "
        f"{'TPOT med':>9} {'ITL p99':>9} {'E2E med':>9}  note"
    )
    lines = [head]
    for r in results:
        s = r.on_hardware
        conc = "inf" if r.concurrency is None else str(r.concurrency)
        note = f"PARTIAL: {r.abort_reason}" if r.partial else ""
        if r.outcome == "failed":
            note = f"✗ FAILED: no request completed ({r.failure})"
        elif r.outcome == "errors":
            note = f"failed requests: {r.failure}"
        lines.append(
            f"{conc:>5} {s.completed:>5} {s.failed + s.incomplete + s.not_sent:>5} {s.request_throughput:>8.3f} "
            f"{s.output_throughput:>10.1f} {s.ttft_ms.median:>9.1f} {s.ttft_ms.p99:>9.1f} {s.tpot_ms.median:>9.2f} "
            f"{s.itl_ms.p99:>9.2f} {s.e2e_ms.median:>9.1f}  {note}"
        )
        if r.diagnosis is not None:
            lines.append(f"      server log: {r.diagnosis}")
    lines.append("latencies in ms; fail = failed + incomplete + not sent")
    if results:
        first = results[0]
        if first.clock.is_twin:
            lines.append(first.clock.note())
        lines.append(f"TTFT clock {first.ttft_clock}: starts {first.definitions['clock']}")
        if first.ttft_clock == "send":
            lines.append("(--ttft-clock connect starts it before encoding and connecting, as SGLang's bench_serving)")
        lines.append(f"ITL: {first.definitions['itl']}")
        if first.prompts_text:
            lines.append(f"prompts: {first.prompts_text}")
        lines.extend(_prompt_tokens(r) for r in results if r.summary.completed)
    return "\n".join(lines)


def _prompt_tokens(r: BenchResult) -> str:
    """What the server counted per prompt, beside what was asked: a length that is off shows here."""
    ok = r.requests[r.requests["status"] == "ok"]
    counted = "as the server counted them" if bool(ok["prompt_tokens_from_server"].all()) else "(client estimate)"
    asked = r.provenance.workload.get("mean_prompt_len")
    of = f" for {asked:,.1f} asked" if isinstance(asked, (int, float)) else ""
    conc = "inf" if r.concurrency is None else r.concurrency
    return f"c={conc}: {ok['prompt_tokens'].mean():,.1f} prompt tokens per request {counted}{of}"


def _print(results: Sequence[BenchResult], fmt: str) -> None:
    if fmt == "json":
        for r in results:
            print(json.dumps(r.row(), allow_nan=False), flush=True)
    elif fmt == "sglang":
        for r in results:
            if r.clock.is_twin:  # bench_serving's block is a measurement on the server's clock: say whose
                print(f"(dsv4lab: {r.clock.caption}; read from the twin's stamps)", flush=True)
            print(serving_block(r), flush=True)
    else:
        print(_table(results))


def _default_api(url: str, options: ClientOptions) -> API:
    """The API the server speaks: OpenAI completions on vLLM (which has no ``/generate``), else SGLang's
    native ``/generate``, bench_serving's default."""
    engine, _, _ = run_sync(engine_at(url, headers=control_headers(options)), what="engine check")
    return "completions" if engine == "vllm" else "generate"


def bench_main(argv: Sequence[str] | None = None) -> int:
    """Run ``dsv4lab bench`` with ``argv``; return its exit status (see the module docstring)."""
    args = build_parser().parse_args(argv)
    try:
        return _bench(args)
    except DSV4LabError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exit_code_for(exc)


def _bench(args: argparse.Namespace) -> int:
    if args.json and args.format not in ("table", "json"):
        raise ConfigError("--json", True, f"not with --format {args.format}")
    fmt = "json" if args.json else args.format
    levels_ = levels(args)
    workload_for = workload_factory(args)
    options = client_options(args)
    load = load_spec(args, levels_[0])
    goal = slo(args)
    if args.ready_check_timeout_sec < 0:
        raise ConfigError("--ready-check-timeout-sec", args.ready_check_timeout_sec, "seconds >= 0")
    target = resolve_target(args)
    interrupted = False
    try:
        if args.ready_check_timeout_sec > 0:
            ready = wait_until_ready(target.url, args.ready_check_timeout_sec, headers=control_headers(options))
            run_sync(ready, what="ready check")
        if args.api is None and args.backend is None:
            options = dataclasses.replace(options, api=_default_api(target.url, options))
        coro = sweep_async(
            target.url,
            workload_for,
            levels_,
            repeats=args.repeats,
            load=load,
            options=options,
            slo=goal,
            label=args.label,
            progress=not args.no_progress and fmt == "table",
            on_server_death=target.on_death if target.handle is not None else None,
            server=ServerContext(
                host=target.host,
                config=target.handle.config if target.handle is not None else None,
                alive=target.handle.is_alive if target.handle is not None else None,
            ),
            store=args.results_dir,
            profile=args.profile,
            profile_output_dir=args.profile_output_dir,
        )
        try:
            results: Sequence[BenchResult] = run_sync(coro, what="benchmark")
        except Interrupted as exc:
            interrupted = True
            results = exc.partial if isinstance(exc.partial, BenchRuns) else BenchRuns()
    finally:
        target.close()
    if args.output_file and results:
        records = [bench_serving_record(r, details=args.output_details, tag=args.label or None) for r in results]
        append_jsonl(args.output_file, records)
    _print(results, fmt)
    if interrupted:
        print("Interrupted: the runs above are what finished.", file=sys.stderr)
        return 130
    bad = any(r.partial or r.summary.completed < r.summary.total for r in results)
    return 1 if bad else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(bench_main())
