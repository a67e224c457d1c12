"""How much load the twin carries, and what the story's configs decode at — measured, not asserted.

Two modes (not timed tests; run by hand, figures go in docs/measured.md):

``capacity`` (default): the twin on the fast ``tiny`` profile, pinned to one CPU core, with N concurrent
OpenAI streaming requests from an aiohttp client pinned to another core. Reports concurrent streams and
streamed tokens/s, and the same for a *peer in the same run*: a bare aiohttp SSE server that only streams
tokens (same core, same client), so the result is a ratio that survives noisy machines.

    .venv/bin/python benchmarks/twin_capacity.py capacity --streams 1000 --tokens 64

``calibrate``: the story's Config A and Config B-fixed on ``rtx-pro-6000-x8`` (paced on the wall clock), at
concurrency 1 and 16 with the story workload (8,000-token prompts, so decode runs at ~8K context);
reports steady-state decode tok/s converted back to modelled time (measured × pace): a
wall-clock reading of a paced twin, so it also shows what host lag costs against the stamps' figures.

    .venv/bin/python benchmarks/twin_capacity.py calibrate --pace 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
READY_TIMEOUT_S = 120.0
REQUEST_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(pid: int, cpus: list[int]) -> None:
    """Pin a process and its descendants to ``cpus`` (best effort; not every platform allows it)."""
    try:
        proc = psutil.Process(pid)
        for p in [proc, *proc.children(recursive=True)]:
            p.cpu_affinity(cpus)
    except (psutil.Error, AttributeError, OSError):
        pass


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    try:
        parent = psutil.Process(proc.pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


async def wait_health(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                async with s.get(base + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError("server not healthy in time")


def start_twin(argv: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "dsv4lab.twin", *argv], env={**os.environ, **env}, stdout=out, stderr=out, cwd=ROOT
    )


# -- capacity ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    streams: int
    tokens: int
    seconds: float
    peak_concurrent: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


async def stream_load(base: str, streams: int, tokens: int) -> LoadResult:
    """``streams`` simultaneous streaming completions, each asking for ``tokens`` tokens; counts chunks."""
    counted = 0
    active = 0
    peak = 0
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    body = {"model": "m", "prompt": "hello there", "max_tokens": tokens, "stream": True}

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal counted, active, peak
        async with session.post(base + "/v1/completions", json=body) as r:
            active += 1
            peak = max(peak, active)
            tail = b""
            async for data in r.content.iter_any():  # cheaper than line iteration: the client must not be the limit
                tail = (tail + data)[-64:]
            active -= 1
            # A stream that ended with [DONE] delivered every token it asked for (the twin may merge
            # tokens into fewer chunks when a handler lags, so chunks would undercount).
            if r.status == 200 and b"data: [DONE]" in tail:
                counted += tokens

    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(session) for _ in range(streams)))
        dt = time.perf_counter() - t0
    return LoadResult(streams, counted, dt, peak)


def peer_server(port: int, ready: object) -> None:  # pragma: no cover - runs in a child process
    """A bare aiohttp SSE server: every request streams ``max_tokens`` small JSON chunks."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(int(body.get("max_tokens", 16))):
            chunk = {"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": f" t{i}"}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            await asyncio.sleep(0)
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    web.run_app(app, host="127.0.0.1", port=port, print=None, backlog=4096)


def capacity(streams: int, tokens: int, server_cpu: int, client_cpu: int) -> dict[str, float]:
    pin(os.getpid(), [client_cpu])
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        env = {
            "DSV4LAB_TWIN_HARDWARE": "tiny",
            "DSV4LAB_TWIN_PACE": "1",
            "DSV4LAB_TWIN_STATE_DIR": tmp,
        }
        twin = start_twin(
            [
                "--model-path",
                "dsv4lab/tiny-moe",
                "--tp-size",
                "2",
                "--port",
                str(port),
                "--max-running-requests",
                str(max(streams * 2, 256)),
                "--skip-server-warmup",
                "--decode-log-interval",
                "1000",
            ],
            env,
            Path(tmp) / "twin.log",
        )
        try:
            asyncio.run(wait_health(f"http://127.0.0.1:{port}", twin))
            pin(twin.pid, [server_cpu])
            r = asyncio.run(stream_load(f"http://127.0.0.1:{port}", streams, tokens))
        finally:
            kill_tree(twin)
        results.update(twin_streams=r.peak_concurrent, twin_tokens_per_s=r.tokens_per_s, twin_seconds=r.seconds)
        port = free_port()
        peer = subprocess.Popen(
            [sys.executable, __file__, "_peer", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            pin(peer.pid, [server_cpu])
            p = asyncio.run(stream_load(f"http://127.0.0.1:{port}", streams, tokens))
        finally:
            kill_tree(peer)
        results.update(peer_streams=p.peak_concurrent, peer_tokens_per_s=p.tokens_per_s)
        results["ratio_twin_to_peer"] = r.tokens_per_s / p.tokens_per_s if p.tokens_per_s else 0.0
    return results


# -- calibrate ------------------------------------------------------------------------------------------------


async def decode_rate(base: str, concurrency: int, prompt: int, new_tokens: int) -> float:
    """Steady-state decode tok/s: tokens received while every request is past its first token."""
    stamps: list[list[tuple[float, int]]] = [[] for _ in range(concurrency)]
    body = {"input_ids": [1] * prompt, "sampling_params": {"max_new_tokens": new_tokens}, "stream": True}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)

    async def one(i: int, session: aiohttp.ClientSession) -> None:
        async with session.post(base + "/generate", json=body) as r:
            async for line in r.content:
                if line.startswith(b"data: {"):
                    n = json.loads(line[6:])["meta_info"]["completion_tokens"]
                    stamps[i].append((time.perf_counter(), n))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout) as s:
        await asyncio.gather(*(one(i, s) for i in range(concurrency)))
    start = max(st[0][0] for st in stamps)
    end = min(st[-1][0] for st in stamps)
    tokens = 0
    for st in stamps:
        inside = [n for t, n in st if start <= t <= end]
        before = [n for t, n in st if t < start]
        if inside:
            tokens += inside[-1] - (before[-1] if before else inside[0])
    return tokens / (end - start) if end > start else 0.0


def calibrate(pace: float, prompt: int, new_tokens: int) -> dict[str, float]:
    from dsv4lab.config.hardware import hardware_profile
    from dsv4lab.config.launch_script import render_argv
    from dsv4lab.config.presets import config_a, config_b_fixed
    from dsv4lab.twin.kernels import config_file_name

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        kdir = Path(tmp) / "kernels"
        kdir.mkdir()
        hw = hardware_profile("rtx-pro-6000-x8")
        for n, k in ((1024, 4096), (4096, 1024)):
            (kdir / config_file_name(n, k, hw)).write_text("{}")
        for name, cfg in (("A", config_a()), ("B-fixed", config_b_fixed())):
            port = free_port()
            env = {
                "DSV4LAB_TWIN_HARDWARE": "rtx-pro-6000-x8",
                "DSV4LAB_TWIN_PACE": str(pace),
                "DSV4LAB_TWIN_STATE_DIR": tmp,
                "DSV4LAB_TWIN_KERNEL_CONFIG_DIR": str(kdir),
                "DSV4LAB_TWIN_SGLANG_VERSION": "0.5.23",
            }
            argv = render_argv(cfg.replace(port=port), "0.5.23")
            twin = start_twin([*argv, "--decode-log-interval", "1000"], env, Path(tmp) / f"{name}.log")
            try:
                asyncio.run(wait_health(f"http://127.0.0.1:{port}", twin))
                for c in (1, 16):
                    rate = asyncio.run(decode_rate(f"http://127.0.0.1:{port}", c, prompt, new_tokens))
                    out[f"{name} C={c}"] = rate * pace
            finally:
                kill_tree(twin)
    out["B-fixed/A at C=1"] = out["B-fixed C=1"] / out["A C=1"]
    out["B-fixed/A at C=16"] = out["B-fixed C=16"] / out["A C=16"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["_peer"]:
        peer_server(int(args[1]), None)
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="mode")
    c = sub.add_parser("capacity")
    c.add_argument("--streams", type=int, default=1000)
    c.add_argument("--tokens", type=int, default=64)
    c.add_argument("--server-cpu", type=int, default=0)
    c.add_argument("--client-cpu", type=int, default=1)
    k = sub.add_parser("calibrate")
    k.add_argument("--pace", type=float, default=0.05, help="the twin paced: the decode rate is read on the wall clock")
    k.add_argument("--prompt", type=int, default=8000)
    k.add_argument("--new-tokens", type=int, default=64)
    ns = p.parse_args(args or ["capacity"])
    if ns.mode == "calibrate":
        res = calibrate(ns.pace, ns.prompt, ns.new_tokens)
    else:
        res = capacity(ns.streams, ns.tokens, ns.server_cpu, ns.client_cpu)
    for key, value in res.items():
        print(f"{key:>24}: {value:,.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
