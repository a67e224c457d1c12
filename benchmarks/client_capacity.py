"""How much load the built-in benchmark client can generate, and how accurately it times it.

One run on loopback, two cores: a streaming server that is never the bottleneck runs in its own process on
core 1; each client runs on core 0. The server is a bare asyncio HTTP/1.1 server (not aiohttp: its
per-chunk cost must stay well below the client's) that streams OpenAI ``/v1/completions`` SSE with usage,
and records the true send time of every chunk (``time.perf_counter`` right after the socket write; on
Linux that is CLOCK_MONOTONIC, shared by both processes). Its first token names the request (``r<id>``),
so any client's per-request output can be matched to the server's record.

Phases, each for dsv4lab's client and, side by side, SGLang's own ``bench_serving`` client (0.5.23,
installed in a separate virtual environment, never a project dependency):

1. capacity — 64 concurrent streams of 512 tokens sent as fast as the server can: requests/s and
   streamed tokens/s the client sustains on one core;
2. timing — 64 concurrent streams paced at TTFT 50 ms / ITL 10 ms: measured TTFT minus the server's TTFT
   (first send − request arrival) and measured ITL minus the true send gap, per chunk.

Usage::

    .venv/bin/python benchmarks/client_capacity.py [--peer-python /tmp/sgl-bench-venv/bin/python]

The peer venv is made with ``python -m venv /tmp/sgl-bench-venv && /tmp/sgl-bench-venv/bin/pip install
--no-deps sglang==0.5.23`` plus the modules its benchmark imports (see the report); a tiny word-level
tokenizer is written locally for ``--dataset-name random-ids`` (no hub download). Without the peer, only
dsv4lab's figures are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLIENT_CORE, SERVER_CORE = 0, 1
STREAMS = 64

# -- the server (runs in its own process) ---------------------------------------------------------------------


class _Server(asyncio.Protocol):
    """One connection of the stand-in server: keep-alive HTTP/1.1, chunked SSE responses."""

    state: ClassVar[dict[str, Any]] = {"ttft": 0.0, "itl": 0.0, "next_id": 0, "records": {}}

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
            self.reply("200 OK", {"records": st["records"], "cpu_s": time.process_time()})
        elif path.startswith("/config"):
            cfg = json.loads(body)
            st.update(ttft=cfg["ttft"], itl=cfg["itl"], records={})
            self.reply("200 OK", {})
        elif path.startswith("/v1/completions"):
            req = json.loads(body)
            st["next_id"] += 1
            rid = st["next_id"]
            rec = {"arrival": self.arrival, "sends": []}
            st["records"][str(rid)] = rec
            asyncio.get_running_loop().create_task(self.stream(rid, int(req["max_tokens"]), rec))
        else:  # /server_info, /get_server_info, /flush_cache, ...
            self.reply("200 OK", {"version": "capacity-test"})

    async def stream(self, rid: int, n: int, rec: dict[str, Any]) -> None:
        t = self.transport
        assert t is not None
        t.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        sends: list[float] = rec["sends"]
        ttft, itl = self.state["ttft"], self.state["itl"]
        start = rec["arrival"]
        for i in range(n):
            due = start + ttft + i * itl
            if itl or ttft:
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            elif i % 16 == 0:
                await asyncio.sleep(0)  # let other streams and the flow control run
            if not self.writable.is_set():
                await self.writable.wait()  # the client is behind: wait for the transport to drain
            text = f"r{rid} " if i == 0 else "tok "
            event = b'data: {"choices":[{"index":0,"text":"' + text.encode() + b'"}]}\n\n'
            t.write(b"%x\r\n%b\r\n" % (len(event), event))
            sends.append(time.perf_counter())
        usage = {"prompt_tokens": 16, "completion_tokens": n, "total_tokens": 16 + n}
        # The usage chunk carries an empty-text choice: SGLang's client indexes choices[0] on every chunk.
        last = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
        tail = b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n"
        t.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(tail), tail))


async def _serve(port_file: str) -> None:
    os.sched_setaffinity(0, {SERVER_CORE})
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_Server, "127.0.0.1", 0, backlog=1024)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    await asyncio.Event().wait()


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


def _errors(server: dict[str, Any], measured: dict[str, tuple[float, list[float]]]) -> tuple[list[float], list[float]]:
    """TTFT and ITL errors in ms: measured minus the server's truth, matched by request id."""
    ttft_err: list[float] = []
    itl_err: list[float] = []
    for rid, (ttft_s, itls_s) in measured.items():
        rec = server["records"].get(rid)
        if rec is None or not rec["sends"]:
            continue
        sends = rec["sends"]
        ttft_err.append((ttft_s - (sends[0] - rec["arrival"])) * 1000)
        true_gaps = [b - a for a, b in itertools.pairwise(sends)]
        itl_err.extend((m - t) * 1000 for m, t in zip(itls_s, true_gaps, strict=False))
    return ttft_err, itl_err


# -- dsv4lab's client ------------------------------------------------------------------------------------------


def _dsv4lab(url: str, n: int, out: int, *, text: bool) -> tuple[Any, float, float]:
    from dsv4lab.bench import ClientOptions, LoadSpec, random_workload, run

    wl = random_workload(n, 16, out, seed=1)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    result = run(
        url,
        wl,
        LoadSpec(concurrency=STREAMS, warmup=1),
        ClientOptions(model="capacity-test", record_text=text, request_timeout_s=300),
        progress=False,
        info={},
        gpus=(),
    )
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return result, wall, cpu


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

_TOKENIZER = """
import json, os, sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, 2000)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")
tok.save(os.path.join(d, "tokenizer.json"))
cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "bos_token": "<s>", "eos_token": "</s>"}
json.dump(cfg, open(os.path.join(d, "tokenizer_config.json"), "w"))
"""


def _sglang(peer: str, url: str, n: int, out: int, work: Path) -> tuple[dict[str, Any], float, float, str]:
    tok = work / "tiny-tokenizer"
    if not (tok / "tokenizer.json").exists():
        subprocess.run([peer, "-c", _TOKENIZER, str(tok)], check=True, timeout=120)
    out_file = work / f"sglang_{n}_{out}_{time.time_ns()}.jsonl"
    argv = [
        peer,
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang-oai",
        "--base-url",
        url,
        "--model",
        "capacity-test",
        "--tokenizer",
        str(tok),
        "--dataset-name",
        "random-ids",
        "--num-prompts",
        str(n),
        "--random-input-len",
        "16",
        "--random-output-len",
        str(out),
        "--random-range-ratio",
        "1",
        "--max-concurrency",
        str(STREAMS),
        "--warmup-requests",
        "1",
        "--output-file",
        str(out_file),
        "--output-details",
        "--disable-tqdm",
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        preexec_fn=lambda: os.sched_setaffinity(0, {CLIENT_CORE}),
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(f"SGLang's client failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    obj = json.loads(out_file.read_text().splitlines()[-1])
    return obj, wall, cpu, proc.stdout


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer-python", default="/tmp/sgl-bench-venv/bin/python")
    parser.add_argument("--capacity-requests", type=int, default=512)
    parser.add_argument("--capacity-tokens", type=int, default=512)
    parser.add_argument("--timing-requests", type=int, default=256)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.serve))
        return 0
    if len(os.sched_getaffinity(0)) < 2:
        print("needs two cores (client and server pinned apart)")
        return 2
    peer = args.peer_python if Path(args.peer_python).exists() else None
    work = Path(tempfile.mkdtemp(prefix="client-capacity-"))
    port_file = work / "port"
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)])
    try:
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        os.sched_setaffinity(0, {CLIENT_CORE})
        n_cap, out_cap, n_tim = args.capacity_requests, args.capacity_tokens, args.timing_requests
        figures: dict[str, dict[str, float]] = {}

        def capacity(name: str, measure: Any) -> None:
            _http(url + "/config", {"ttft": 0.0, "itl": 0.0})
            srv0 = _http(url + "/timings")["cpu_s"]
            req_s, tok_s, client_cores, duration = measure()
            srv_cpu = _http(url + "/timings")["cpu_s"] - srv0
            figures[name] = {
                "req_s": req_s,
                "tok_s": tok_s,
                "client_cpu": client_cores,
                "server_cpu": srv_cpu / duration,  # the server only works while the run lasts
            }

        def ours_capacity() -> tuple[float, float, float, float]:
            result, wall, cpu = _dsv4lab(url, n_cap, out_cap, text=False)
            s = result.summary
            return s.request_throughput, s.output_throughput, cpu / wall, s.duration_s

        def peer_capacity() -> tuple[float, float, float, float]:
            assert peer is not None
            obj, wall, cpu, _ = _sglang(peer, url, n_cap, out_cap, work)
            # Its process also spends seconds importing torch & co. before the run, so its client CPU is an
            # average over the whole process (start-up included); its throughputs are its own, over its run.
            return obj["request_throughput"], obj["output_throughput"], cpu / wall, float(obj["duration"])

        def timing(name: str, measure: Any) -> None:
            _http(url + "/config", {"ttft": 0.05, "itl": 0.01})
            measured, stamps = measure()
            truth = _http(url + "/timings")
            ttft_err, itl_err = _errors(truth, measured)
            delays = [(t - truth["records"][rid]["sends"][0]) * 1000 for rid, t in stamps.items()]
            figures[name].update(
                stamp_delay_med=statistics.median(delays) if delays else float("nan"),
                stamp_delay_p99=_pct(delays, 99),
            )
            figures[name].update(
                ttft_err_med=statistics.median(ttft_err),
                ttft_err_p99=_pct(ttft_err, 99),
                itl_err_med=statistics.median(itl_err),
                itl_err_p99=_pct(itl_err, 99),
                itl_abs_err_p99=_pct([abs(x) for x in itl_err], 99),
                matched=len(ttft_err),
            )

        capacity("dsv4lab", ours_capacity)
        timing("dsv4lab", lambda: _dsv4lab_measured(_dsv4lab(url, n_tim, 64, text=True)[0]))
        peer_error = ""
        if peer is not None:
            try:
                capacity("sglang 0.5.23", peer_capacity)
                timing("sglang 0.5.23", lambda: (_sglang_measured(_sglang(peer, url, n_tim, 64, work)[0]), {}))
            except Exception as exc:  # report, do not hide, why the peer could not run
                peer_error = str(exc)
                figures.pop("sglang 0.5.23", None)
        else:
            peer_error = f"no peer venv at {args.peer_python}"
    finally:
        server.kill()
        server.wait(timeout=10)

    names = list(figures)
    print(f"loopback, client pinned to core {CLIENT_CORE}, server to core {SERVER_CORE}, {STREAMS} concurrent streams")
    print(_row("", names))
    print(f"capacity: {n_cap} requests x {out_cap} tokens, server streams as fast as the client reads")
    for key, label, fmt in (
        ("req_s", "  requests/s", "{:.1f}"),
        ("tok_s", "  streamed tokens/s", "{:.0f}"),
        ("client_cpu", "  client CPU (cores)*", "{:.2f}"),
        ("server_cpu", "  server CPU (cores)", "{:.2f}"),
    ):
        print(_row(label, [fmt.format(figures[n][key]) for n in names]))
    print("  * over the client process's run call; SGLang's includes its start-up (imports), so it reads low")
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
    if "sglang 0.5.23" in figures:
        ratio = figures["dsv4lab"]["tok_s"] / figures["sglang 0.5.23"]["tok_s"]
        print(f"dsv4lab / sglang streamed tokens/s: {ratio:.2f}x (target >= 2x)")
    else:
        print(f"SGLang's client could not run: {peer_error}")
    for key, what in (
        ("ttft_err_p99", "TTFT error vs the server's TTFT"),
        ("stamp_delay_p99", "first-token stamp delay"),
    ):
        value = figures["dsv4lab"][key]
        print(f"dsv4lab {what}: p99 {value:.3f} ms at {STREAMS} streams ({'meets' if value < 1 else 'misses'} < 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
