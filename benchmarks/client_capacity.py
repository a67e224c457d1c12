"""How much load the built-in benchmark client can generate, and how accurately it times it.

One run on loopback: each client runs pinned to core 0; a streaming stand-in server runs in its own
process(es) on the other cores, and must never be the bottleneck — a saturated server caps both clients
at its own speed and squeezes their ratio towards 1. So the server is cheap per token (each stream's
events are written in bursts of up to 16 per ``write``; the bytes on the wire are exactly what one write per
event gives: one HTTP chunk and one SSE event per token), runs as ``--server-procs`` processes sharing the
port (``SO_REUSEPORT``; default: every core but the client's), and its CPU is measured per process over
each phase. A phase where any server process was busy for 90% or more of the run is reported as
*saturated*, and no ratio is printed from it.

The server is a bare asyncio HTTP/1.1 server (not aiohttp: its per-chunk cost must stay well below the
client's) that streams OpenAI ``/v1/completions`` SSE with usage and records the true send time of every
chunk (``time.perf_counter`` right after the socket write; on Linux that is CLOCK_MONOTONIC, shared by all
processes). Its first token names the request (``r<process>x<id>``), so any client's per-request output can
be matched to the server's record.

Phases, each for dsv4lab's client and, side by side, SGLang's own ``bench_serving`` client (0.5.23, from the
venv ``make test`` builds, run through ``benchmarks/sglang_peer.py``; never a project dependency):

1. capacity — 64 concurrent streams of 512 tokens sent as fast as the client reads: requests/s and
   streamed tokens/s the client sustains on one core, and streamed tokens per CPU-second of the client (its
   CPU time sampled every 50 ms and read between the first measured request's arrival and the last token's
   send, on the server's clock: imports, start-up and warmup are outside it for both clients; on a shared
   machine a client may get less than its core, which this figure allows for);
2. timing — 64 concurrent streams paced at TTFT 50 ms / ITL 10 ms: measured TTFT minus the server's TTFT
   (first send − request arrival) and measured ITL minus the true send gap, per chunk.

Usage::

    .venv/bin/python benchmarks/client_capacity.py [--peer-python PATH] [--server-procs N]

Without the peer, only dsv4lab's figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
from typing import Any, ClassVar

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CLIENT_CORE = 0
STREAMS = 64
#: Events written per ``write`` when streaming as fast as possible (the bytes are the same as one per write).
BURST = 16
#: A server process busy this share of the run or more is saturated: no ratio is printed from that phase.
SATURATED = 0.90

# -- the server (runs in its own processes) --------------------------------------------------------------------


class _Server(asyncio.Protocol):
    """One connection of the stand-in server: keep-alive HTTP/1.1, chunked SSE responses."""

    state: ClassVar[dict[str, Any]] = {"ttft": 0.0, "itl": 0.0, "next_id": 0, "records": {}, "name": "0"}

    def __init__(self) -> None:
        self.buf = b""
        self.arrival = 0.0
        self.writable = asyncio.Event()
        self.writable.set()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def data_received(self, data: bytes) -> None:
        # Stamp now, parse in the next loop iteration: when 64 requests arrive together, the 64th stamp must
        # not wait for 63 parses (the truth must not include the server's own work).
        self.arrival = time.perf_counter()
        self.buf += data
        asyncio.get_running_loop().call_soon(self.parse)

    def parse(self) -> None:
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            self.handle(head.split(" ")[0], head.split(" ")[1], body)

    def reply(self, status: str, obj: object) -> None:
        payload = json.dumps(obj).encode()
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        assert self.transport is not None
        self.transport.write(head.encode() + payload)

    def handle(self, method: str, path: str, body: bytes) -> None:
        st = self.state
        if path.startswith("/v1/models"):
            self.reply("200 OK", {"object": "list", "data": [{"id": "capacity-test", "object": "model"}]})
        elif path.startswith("/timings"):
            self.reply("200 OK", {"records": st["records"]})
        elif path.startswith("/config"):
            cfg = json.loads(body)
            st.update(ttft=cfg["ttft"], itl=cfg["itl"], records={})
            self.reply("200 OK", {})
        elif path.startswith("/v1/completions"):
            req = json.loads(body)
            st["next_id"] += 1
            rid = f"{st['name']}x{st['next_id']}"
            rec = {"arrival": self.arrival, "sends": []}
            st["records"][rid] = rec
            asyncio.get_running_loop().create_task(self.stream(rid, int(req["max_tokens"]), rec))
        else:  # /server_info, /get_server_info, /model_info, /flush_cache, ...
            self.reply("200 OK", {"version": "capacity-test"})

    async def stream(self, rid: str, n: int, rec: dict[str, Any]) -> None:
        t = self.transport
        assert t is not None
        t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        sends: list[float] = rec["sends"]
        ttft, itl = self.state["ttft"], self.state["itl"]
        start = rec["arrival"]
        first = _chunk(f"r{rid} ")
        i = 0
        while i < n:
            if itl or ttft:  # paced: one event per write, at its due time
                delay = start + ttft + i * itl - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                k = 1
            else:  # as fast as the client reads: a burst of events per write, the same bytes on the wire
                await asyncio.sleep(0)  # let other streams and the flow control run
                k = min(BURST, n - i)
            if not self.writable.is_set():
                await self.writable.wait()  # the client is behind: wait for the transport to drain
            t.write((first + _TOKEN * (k - 1)) if i == 0 else _TOKEN * k)
            now = time.perf_counter()
            sends.extend([now] * k)
            i += k
        usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
        # The usage chunk carries an empty-text choice: SGLang's client indexes choices[0] on every chunk.
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
        tail = b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n"
        t.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail))


def _chunk(text: str) -> bytes:
    """One token's SSE event as one HTTP chunk."""
    event = b'data: {"choices":[{"index":0,"text":"' + text.encode() + b'"}]}\n\n'
    return b"%x\r\n%b\r\n" % (len(event), event)


_TOKEN = _chunk("tok ")


async def _serve(name: str, data_port: int, port_file: str, core: int) -> None:
    os.sched_setaffinity(0, {core})
    _Server.state["name"] = name
    loop = asyncio.get_running_loop()
    await loop.create_server(_Server, "127.0.0.1", data_port, backlog=1024, reuse_port=True)
    control = await loop.create_server(_Server, "127.0.0.1", 0, backlog=64)
    Path(port_file).write_text(str(control.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


class Servers:
    """The stand-in's processes: one shared data port, one control port each, CPU time per process."""

    def __init__(self, procs: int, cores: list[int], work: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.cores = cores
        self.procs: list[subprocess.Popen[bytes]] = []
        self.control: list[int] = []
        for i in range(procs):
            port_file = work / f"control-{i}"
            argv = [
                sys.executable,
                __file__,
                "--serve",
                str(i),
                str(self.port),
                str(port_file),
                str(cores[i % len(cores)]),
            ]
            self.procs.append(subprocess.Popen(argv))
            deadline = time.monotonic() + 30
            while not port_file.exists() or not port_file.read_text():
                if time.monotonic() > deadline or self.procs[-1].poll() is not None:
                    raise RuntimeError("a server process did not start")
                time.sleep(0.05)
            self.control.append(int(port_file.read_text()))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def configure(self, ttft: float, itl: float) -> None:
        for port in self.control:
            _http(f"http://127.0.0.1:{port}/config", {"ttft": ttft, "itl": itl})

    def records(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for port in self.control:
            out.update(_http(f"http://127.0.0.1:{port}/timings")["records"])
        return out

    def cpu(self) -> list[float]:
        """CPU seconds (user + system) of each server process so far."""
        times = [psutil.Process(p.pid).cpu_times() for p in self.procs]
        return [t.user + t.system for t in times]

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait(timeout=10)


# -- helpers ---------------------------------------------------------------------------------------------------


def _http(url: str, body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as resp:  # noqa: S310
        return json.loads(resp.read())


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    k = (len(values) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def _errors(records: dict[str, Any], measured: dict[str, tuple[float, list[float]]]) -> tuple[list[float], list[float]]:
    """TTFT and ITL errors in ms: measured minus the server's truth, matched by request id."""
    ttft_err: list[float] = []
    itl_err: list[float] = []
    for rid, (ttft_s, itls_s) in measured.items():
        rec = records.get(rid)
        if rec is None or not rec["sends"]:
            continue
        sends = rec["sends"]
        ttft_err.append((ttft_s - (sends[0] - rec["arrival"])) * 1000)
        true_gaps = [b - a for a, b in itertools.pairwise(sends)]
        itl_err.extend((m - t) * 1000 for m, t in zip(itls_s, true_gaps, strict=False))
    return ttft_err, itl_err


# -- dsv4lab's client ------------------------------------------------------------------------------------------


def _dsv4lab(url: str, n: int, out: int, *, text: bool) -> tuple[Any, tuple[tuple[float, float], ...]]:
    from sglang_peer import CpuSampler

    from dsv4lab.bench import ClientOptions, LoadSpec, ServerContext, random_workload, run

    wl = random_workload(n, 16, out, seed=1)
    sampler = CpuSampler(os.getpid())
    result = run(
        url,
        wl,
        LoadSpec(concurrency=STREAMS, warmup=1),
        ClientOptions(model="capacity-test", record_text=text, request_timeout_s=300),
        progress=False,
        server=ServerContext(info={}, gpus=()),
    )
    return result, sampler.stop()


def _dsv4lab_measured(result: Any) -> tuple[dict[str, tuple[float, list[float]]], dict[str, float]]:
    """Per request id: (TTFT, ITLs) in seconds, and the absolute perf_counter of the first-token stamp."""
    out: dict[str, tuple[float, list[float]]] = {}
    stamps: dict[str, float] = {}
    frame = result.requests
    for _, row in frame.iterrows():
        if row["status"] != "ok" or not row.get("text"):
            continue
        rid = row["text"].split()[0][1:]
        out[rid] = (row["ttft_ms"] / 1000, [g / 1000 for g in row["itl_ms"]])
        stamps[rid] = result.origin_perf_s + row["start_s"] + row["ttft_ms"] / 1000
    return out, stamps


# -- SGLang's client -------------------------------------------------------------------------------------------


def _sglang(
    peer: Any, url: str, n: int, out: int, work: Path
) -> tuple[dict[str, Any], tuple[tuple[float, float], ...]]:
    from sglang_peer import run_peer

    args = ["--backend", "sglang-oai", "--base-url", url, "--model", "capacity-test", "--dataset-name", "random-ids"]
    args += ["--num-prompts", str(n), "--random-input-len", "16", "--random-output-len", str(out)]
    args += ["--random-range-ratio", "1", "--max-concurrency", str(STREAMS), "--warmup-requests", "1"]
    args += ["--output-details", "--disable-tqdm", "--ready-check-timeout-sec", "0"]
    run = run_peer(peer, args, work / f"sglang_{n}_{out}_{time.time_ns()}.jsonl", core=CLIENT_CORE)
    return run.result, run.cpu_samples


def _sglang_measured(obj: dict[str, Any]) -> dict[str, tuple[float, list[float]]]:
    out: dict[str, tuple[float, list[float]]] = {}
    for text, ttft, itls, err in zip(obj["generated_texts"], obj["ttfts"], obj["itls"], obj["errors"], strict=False):
        if err or not text:
            continue
        out[text.split()[0][1:]] = (ttft, list(itls))
    return out


# -- main ------------------------------------------------------------------------------------------------------


def _row(name: str, cols: list[str]) -> str:
    return f"{name:<44}" + "".join(f"{c:>16}" for c in cols)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--peer-python", default=None, help="SGLang venv python (default: the one make test builds)")
    parser.add_argument("--server-procs", type=int, default=None, help="stand-in server processes (default: cores-1)")
    parser.add_argument("--capacity-requests", type=int, default=512)
    parser.add_argument("--capacity-tokens", type=int, default=512)
    parser.add_argument("--timing-requests", type=int, default=256)
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        name, port, port_file, core = args.serve
        asyncio.run(_serve(name, int(port), port_file, int(core)))
        return 0
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or CLIENT_CORE not in cores:
        print("needs two cores, core 0 among them (client and server pinned apart)")
        return 2
    server_cores = [c for c in cores if c != CLIENT_CORE]
    procs = args.server_procs or len(server_cores)
    from sglang_peer import cpu_between, find_peer

    work = Path(tempfile.mkdtemp(prefix="client-capacity-"))
    peer, peer_error = find_peer(args.peer_python, work)
    servers = Servers(procs, server_cores, work)
    figures: dict[str, dict[str, float]] = {}
    try:
        url = servers.url
        os.sched_setaffinity(0, {CLIENT_CORE})
        n_cap, out_cap, n_tim = args.capacity_requests, args.capacity_tokens, args.timing_requests

        def capacity(name: str, measure: Any) -> None:
            servers.configure(0.0, 0.0)
            cpu0 = servers.cpu()
            req_s, tok_s, duration, samples = measure()
            busy = [(b - a) / duration for a, b in zip(cpu0, servers.cpu(), strict=True)]
            # The client's CPU from the first request's arrival to the last token's send (the server's clock,
            # shared): start-up and imports are outside it, for both clients alike.
            # The first request to arrive is the warmup (both clients send one, then SGLang's sleeps 1 s).
            records = sorted(servers.records().values(), key=lambda r: float(r["arrival"]))[1:]
            start = min(r["arrival"] for r in records)
            end = max(r["sends"][-1] for r in records if r["sends"])
            tokens = sum(len(r["sends"]) for r in records)
            cpu = cpu_between(samples, start, end)
            figures[name] = {
                "req_s": req_s,
                "tok_s": tok_s,
                "client_cpu": cpu / (end - start),
                "tok_per_cpu_s": tokens / cpu if cpu > 0 else float("nan"),
                "server_cpu": sum(busy),  # the server only works while the run lasts
                "server_busiest": max(busy),
            }

        def ours_capacity() -> tuple[float, float, float, Any]:
            result, samples = _dsv4lab(url, n_cap, out_cap, text=False)
            s = result.summary
            return s.request_throughput, s.output_throughput, s.duration_s, samples

        def peer_capacity() -> tuple[float, float, float, Any]:
            obj, samples = _sglang(peer, url, n_cap, out_cap, work)
            return obj["request_throughput"], obj["output_throughput"], float(obj["duration"]), samples

        def timing(name: str, measure: Any) -> None:
            servers.configure(0.05, 0.01)
            measured, stamps = measure()
            records = servers.records()
            ttft_err, itl_err = _errors(records, measured)
            delays = [(t - records[rid]["sends"][0]) * 1000 for rid, t in stamps.items() if rid in records]
            figures[name].update(
                stamp_delay_med=statistics.median(delays) if delays else float("nan"),
                stamp_delay_p99=_pct(delays, 99),
                ttft_err_med=statistics.median(ttft_err),
                ttft_err_p99=_pct(ttft_err, 99),
                itl_err_med=statistics.median(itl_err),
                itl_err_p99=_pct(itl_err, 99),
                itl_abs_err_p99=_pct([abs(x) for x in itl_err], 99),
                matched=len(ttft_err),
            )

        capacity("dsv4lab", ours_capacity)
        timing("dsv4lab", lambda: _dsv4lab_measured(_dsv4lab(url, n_tim, 64, text=True)[0]))
        if peer is not None:
            try:
                capacity("sglang 0.5.23", peer_capacity)
                timing("sglang 0.5.23", lambda: (_sglang_measured(_sglang(peer, url, n_tim, 64, work)[0]), {}))
            except Exception as exc:  # report, do not hide, why the peer could not run
                peer_error = str(exc)
                figures.pop("sglang 0.5.23", None)
    finally:
        servers.close()

    names = list(figures)
    print(
        f"loopback, client pinned to core {CLIENT_CORE}; {procs} server process(es) on core(s) "
        f"{','.join(map(str, server_cores))}; {STREAMS} concurrent streams"
    )
    print(_row("", names))
    print(f"capacity: {n_cap} requests x {out_cap} tokens, server streams as fast as the client reads")
    for key, label, fmt in (
        ("req_s", "  requests/s", "{:.1f}"),
        ("tok_s", "  streamed tokens/s", "{:.0f}"),
        ("client_cpu", "  client CPU in the run (cores)", "{:.2f}"),
        ("tok_per_cpu_s", "  streamed tokens per client CPU-s", "{:.0f}"),
        ("server_cpu", "  server CPU, all processes (cores)", "{:.2f}"),
        ("server_busiest", "  server CPU, busiest process (cores)", "{:.2f}"),
    ):
        print(_row(label, [fmt.format(figures[n][key]) for n in names]))
    print("  (a client below 1.00 core shared its core with other work: the per-CPU-second figure allows for it)")
    print(f"timing: {n_tim} requests x 64 tokens, server paced at TTFT 50 ms, ITL 10 ms")
    for key, label in (
        ("ttft_err_med", "  TTFT error median (ms)"),
        ("ttft_err_p99", "  TTFT error p99 (ms)"),
        ("itl_err_med", "  ITL error median (ms)"),
        ("itl_err_p99", "  ITL error p99 (ms)"),
        ("itl_abs_err_p99", "  |ITL error| p99 (ms)"),
        ("stamp_delay_med", "  1st-token stamp - true send, median (ms)"),
        ("stamp_delay_p99", "  1st-token stamp - true send, p99 (ms)"),
        ("matched", "  requests matched"),
    ):
        print(_row(label, [f"{figures[n].get(key, float('nan')):.3f}" for n in names]))
    saturated = [n for n in names if figures[n]["server_busiest"] >= SATURATED]
    if "sglang 0.5.23" not in figures:
        print(f"SGLang's client could not run: {peer_error}")
    elif saturated:
        print(
            f"no ratio: the server was saturated in the capacity run of {', '.join(saturated)} (a process busy "
            f">= {SATURATED:.0%} of the run), so the figures measure the server; add cores (--server-procs)"
        )
    else:
        ours, theirs = figures["dsv4lab"], figures["sglang 0.5.23"]
        busiest = max(figures[n]["server_busiest"] for n in names)
        print(
            f"dsv4lab / sglang streamed tokens/s: {ours['tok_s'] / theirs['tok_s']:.2f}x; per client CPU-second: "
            f"{ours['tok_per_cpu_s'] / theirs['tok_per_cpu_s']:.2f}x (server busiest process {busiest:.2f} cores)"
        )
    for key, what in (
        ("ttft_err_p99", "TTFT error vs the server's TTFT"),
        ("stamp_delay_p99", "first-token stamp delay"),
    ):
        value = figures["dsv4lab"][key]
        print(f"dsv4lab {what}: p99 {value:.3f} ms at {STREAMS} streams ({'meets' if value < 1 else 'misses'} < 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
