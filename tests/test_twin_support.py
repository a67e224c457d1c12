"""Helpers shared by the twin tests: starting twins, cleaning up process trees, checking log lines.

Log checks use the expressions of ``reference/sglang.md`` §10: every record line must carry SGLang's
prefix, and every line of a known kind must match that kind's expression. Segments without a prefix
are allowed only as continuations (tracebacks, hint blocks) or tqdm bars.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
STARTUP_TIMEOUT_S = 30.0

PREFIX = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:\.\d{3})?((?: [A-Z_]+\d+)*)\] ")
KINDS: dict[str, re.Pattern[str]] = {
    "Load weight end": re.compile(
        r"Load weight end\. (?:elapsed=[\d.]+ s, )?type=(\w+), .*?avail mem=([\d.]+) GB, mem usage=([\d.]+) GB"
    ),
    "KV Cache is allocated": re.compile(
        r"KV Cache (?:is allocated|VA upper bound)\. (?:dtype: \S+, )?#tokens: (\d+), "
        r"(?:K size: ([\d.]+) GB, V size: ([\d.]+) GB|KV size: ([\d.]+) GB)"
    ),
    "cuda graph end": re.compile(
        r"Capture (?:draft |draft extend )?cuda graph end\. Time elapsed: ([\d.]+) s\. mem usage=([\d.]+) GB\. "
        r"avail mem=([\d.]+) GB"
    ),
    "CUDA graph end": re.compile(
        r"Capture (target|draft) (prefill|decode|verify|extend) CUDA graph end\. (?:bs=\[.*?\], )?"
        r"elapsed=([\d.]+) s, mem usage=([\d.]+) GB, avail mem=([\d.]+) GB"
    ),
    "max_total_num_tokens=": re.compile(
        r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
        r"max_running_requests=(\d+), context_len=(\d+), available_gpu_mem=([\d.]+) GB"
    ),
    "Decode batch": re.compile(
        r"Decode batch[.,].*?#running-req: (\d+), .*?token usage: ([\d.]+), (?:accept len: ([\d.]+), "
        r"(?:accept rate: ([\d.]+), )?)?.*?cuda graph: (True|False), gen throughput \(token/s\): ([\d.]+), "
        r"#queue-req: (\d+)"
    ),
    "CUDA out of memory. Tried": re.compile(
        r"CUDA out of memory\. Tried to allocate ([\d.]+ [KMG]iB|\d+ bytes)\. GPU (\d+) has a total capacity of "
        r"([\d.]+ [KMG]iB) of which ([\d.]+ [KMG]iB|\d+ bytes) is free"
    ),
}
TQDM = re.compile(r"^(Capturing batches|Loading safetensors checkpoint shards).*\|.*\d+/\d+")
BASH_JOB = re.compile(r"line \d+: +\d+ (Killed|Terminated)")


def check_log(text: str) -> list[str]:
    """Problems with the log's lines (empty = every line parses); also returns nothing for empty logs."""
    problems: list[str] = []
    in_block = False
    for seg in re.split(r"[\r\n]", text):
        if not seg.strip():
            continue
        if TQDM.match(seg) or BASH_JOB.search(seg):
            continue
        m = PREFIX.match(seg)
        if m is None:
            if not in_block:
                problems.append(f"unprefixed line outside a multi-line record: {seg[:120]!r}")
            continue
        body = seg[m.end() :]
        in_block = body.startswith("Scheduler hit an exception") or body.startswith("Initialization failed")
        for key, rx in KINDS.items():
            if key in body and not rx.search(body):
                problems.append(f"{key!r} line does not parse: {body[:200]!r}")
        if m.group(2) and not re.fullmatch(r"( (DP|TP|EP)\d+)+", m.group(2)):
            problems.append(f"bad rank prefix {m.group(2)!r}")
    # OOM text inside tracebacks (no prefix) must parse too.
    for line in text.splitlines():
        if "CUDA out of memory. Tried" in line and not KINDS["CUDA out of memory. Tried"].search(line):
            problems.append(f"OOM line does not parse: {line[:200]!r}")
    return problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every descendant, and wait for them (bounded)."""
    try:
        parent = psutil.Process(pid)
        procs = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def twin_env(tmp: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "DSV4LAB_TWIN_HARDWARE": "tiny",
            "DSV4LAB_TWIN_PACE": "0.02",
            "DSV4LAB_TWIN_STATE_DIR": str(tmp / "state"),
            "PYTHONPATH": str(ROOT),
        }
    )
    env.pop("DSV4LAB_TWIN_FAULT", None)
    env.update(extra)
    return env


@contextlib.contextmanager
def running_twin(argv: list[str], env: Mapping[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Start ``python -m dsv4lab.twin argv`` with output in ``log``; always kill its tree afterwards."""
    with log.open("ab") as out:
        proc = subprocess.Popen([PY, "-m", "dsv4lab.twin", *argv], env=dict(env), stdout=out, stderr=out, cwd=ROOT)
    try:
        yield proc
    finally:
        kill_tree(proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def wait_for(predicate: object, timeout: float, what: str) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = STARTUP_TIMEOUT_S) -> None:
    async def poll() -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
            while time.monotonic() < deadline:
                assert proc.poll() is None, f"twin exited with {proc.returncode}"
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with s.get(f"http://127.0.0.1:{port}/health") as r:
                        if r.status == 200:
                            return
                await asyncio.sleep(0.05)
        raise AssertionError("twin never became healthy")

    asyncio.run(poll())
