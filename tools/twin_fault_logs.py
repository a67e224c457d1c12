#!/usr/bin/env python3
"""Run the twin once per fault it supports and keep each ``server.log`` with a label, for the diagnosis scoring.

The twin (``python -m dsv4lab.twin``, the tiny TP2 model, time scale 0.02) reproduces the ways a launch
goes wrong: every rehearsable fault of ``dsv4lab/twin/faults.py`` and the failures its memory model makes
by itself (a capture OOM at too high a static fraction, a KV budget <= 0 at too low a one, the draft's graph
capture and KV pool running out on 0.5.4, a rejected flag). Each label says what the twin did — the fault's
definition, the exit status and the run's own lines — never what the diagnosis answers, so the logs score
the rules like the corpus does (``tools/diagnosis_accuracy.py``, split ``twin``).

    .venv/bin/python tools/twin_fault_logs.py [--out tests/data/logs/twin_faults] [--only NAME ...]

Writes ``twin-<name>.log`` and ``twin-<name>.json`` per scenario (timestamps, ports and pids differ from run
to run; the lines and labels do not). Takes about a minute; needs nothing but this checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "logs" / "twin_faults"
TINY = ("--model-path", "dsv4lab/tiny-moe", "--tp-size", "2")
SCALE = "0.02"
START_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 60.0
SETTLE_S = 1.5
GPU_IN_OOM = re.compile(r"GPU (\d+) has a total capacity")


@dataclass(frozen=True)
class Scenario:
    """One twin run: its fault (or arguments that fail by themselves), how it ends, and its label."""

    name: str
    kind: str
    outcome: str | None
    phase: str | None
    decisive: str | None  # a substring of the decisive line; None when the log cannot hold one
    cause: str
    fault: str | None = None
    argv: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    end: str = "exit"  # "exit" (wait for it to die), "ready" (up, no traffic), "serve" (up, a few requests), "hang"
    gpu_from_oom: bool = False  # the failing GPU is the one the first OOM names
    gpu: int | None = None
    runner: str | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "clean-ready",
        "clean_startup",
        "ready",
        "warmup",
        "The server is fired up and ready to roll!",
        "A clean start of the tiny TP2 model; the log ends with no request served after the ready line.",
        end="ready",
    ),
    Scenario(
        "clean-serving",
        "clean_serving",
        "ready",
        "serving",
        "The server is fired up and ready to roll!",
        "A clean start, then three /generate requests served (access lines and batch stats after the ready line).",
        argv=("--decode-log-interval", "1"),
        end="serve",
    ),
    Scenario(
        "silent-death",
        "silent_death",
        "crash",
        "weight_loading",
        None,
        "Fault silent_death: the whole tree is SIGKILLed during weight loading and logs nothing (exit 137).",
        fault="silent_death",
    ),
    Scenario(
        "capture-hang",
        "capture_hang",
        None,
        "cuda_graph_capture",
        None,
        "Fault capture_hang: CUDA graph capture begins and never progresses while every process stays alive; "
        "the file cannot say whether it is hung (a watcher's liveness check can).",
        fault="capture_hang",
        end="hang",
        runner="target",
    ),
    Scenario(
        "nccl-error",
        "nccl_init",
        "crash",
        "startup_other",
        "NCCL error in:",
        "Fault nccl_error: distributed init fails on TP1 with an NCCL system error; SIGQUIT chain, exit 137.",
        fault="nccl_error",
    ),
    Scenario(
        "port-in-use",
        "port_in_use",
        "crash",
        "warmup",
        "error while attempting to bind on address",
        "Fault port_in_use: every scheduler is ready, then the HTTP server cannot bind its port (SGLang starts "
        "the HTTP server after the schedulers: the 'HTTP server + warmup' step); exit 1.",
        fault="port_in_use",
    ),
    Scenario(
        "crash-serving",
        "serving_crash",
        "crash",
        "serving",
        "illegal memory access was encountered",
        "Fault crash_serving: scheduler rank 0 (GPU 0) dies with a CUDA illegal memory access after the ready "
        "line; SIGQUIT chain, exit 137.",
        fault="crash_serving:2",
        gpu=0,
    ),
    Scenario(
        "slow-start",
        "slow_startup",
        "ready",
        "warmup",
        "The server is fired up and ready to roll!",
        "Fault slow_start: every startup phase takes 4 times longer, and the server still comes up (no traffic).",
        fault="slow_start:4",
        end="ready",
    ),
    Scenario(
        "capture-oom",
        "oom_capture",
        "oom",
        "cuda_graph_capture",
        "torch.OutOfMemoryError: CUDA out of memory",
        "--mem-fraction-static 0.97 leaves too little outside the static share for the target's CUDA graphs: "
        "the capture OOMs (Capture cuda graph failed); exit 137.",
        argv=("--mem-fraction-static", "0.97"),
        gpu_from_oom=True,
        runner="target",
    ),
    Scenario(
        "kv-budget",
        "kv_budget",
        "oom",
        "kv_cache_alloc",
        "Not enough memory. Please try to increase --mem-fraction-static",
        "--mem-fraction-static 0.05 is below the weights' share, so the KV pool budget is <= 0; exit 137.",
        argv=("--mem-fraction-static", "0.05"),
    ),
    Scenario(
        "draft-capture-oom",
        "oom_draft_capture",
        "oom",
        "draft_cuda_graph_capture",
        "torch.OutOfMemoryError: CUDA out of memory",
        "SGLang 0.5.4 builds the EAGLE draft (3 steps, topk 4, 8 draft tokens) after the target's graphs, from "
        "the slack: at 0.77 the draft-extend graph capture OOMs; exit 137.",
        argv=(
            "--mem-fraction-static",
            "0.77",
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "4",
            "--speculative-num-draft-tokens",
            "8",
        ),
        env={"DSV4LAB_TWIN_SGLANG_VERSION": "0.5.4"},
        gpu_from_oom=True,
        runner="draft",
    ),
    Scenario(
        "draft-kv-oom",
        "oom_kv",
        "oom",
        "kv_cache_alloc",
        "torch.OutOfMemoryError: CUDA out of memory",
        "SGLang 0.5.4 at 0.80 with EAGLE (3 steps, topk 1): the draft's own KV pool, allocated from the slack "
        "after its weights, does not fit on either GPU (both ranks fail at once, in no fixed order, so no one GPU "
        "is the failing one); exit 137.",
        argv=(
            "--mem-fraction-static",
            "0.80",
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
        ),
        env={"DSV4LAB_TWIN_SGLANG_VERSION": "0.5.4"},
    ),
    Scenario(
        "bad-flag",
        "arg_parse",
        "crash",
        "startup_other",
        "error: unrecognized arguments",
        "The launch command has a flag the parser does not know: argparse prints its usage and exits 2.",
        argv=("--no-such-flag", "3"),
    ),
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _generate(port: int) -> None:
    body = json.dumps({"text": "The capital of France is", "sampling_params": {"max_new_tokens": 16}}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (a Request to 127.0.0.1)
        r.read()


def _settled(log: Path) -> bool:
    size = log.stat().st_size
    time.sleep(SETTLE_S)
    return log.stat().st_size == size


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the twin's process group (it was started in its own session) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def run(sc: Scenario, tmp: Path) -> tuple[str, int | None]:
    """Run one scenario; the log text and the exit status (None when the tool stopped a live server)."""
    port = _free_port()
    log = tmp / "server.log"
    env = {
        **os.environ,
        "DSV4LAB_TWIN_HARDWARE": "tiny",
        "DSV4LAB_TWIN_TIME_SCALE": SCALE,
        "DSV4LAB_TWIN_STATE_DIR": str(tmp / "state"),
        "PYTHONPATH": str(ROOT),
        **sc.env,
    }
    env.pop("DSV4LAB_TWIN_FAULT", None)
    if sc.fault:
        env["DSV4LAB_TWIN_FAULT"] = sc.fault
    argv = [sys.executable, "-m", "dsv4lab.twin", *TINY, "--port", str(port), *sc.argv]
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=out, cwd=ROOT, start_new_session=True)
    status: int | None = None
    try:
        if sc.end == "exit":
            status = proc.wait(timeout=EXIT_TIMEOUT_S)
        elif sc.end == "hang":
            _wait(lambda: log.read_text(errors="replace").count("graph begin") >= 2, START_TIMEOUT_S, "the capture")
            _wait(lambda: _settled(log), START_TIMEOUT_S, "the log to stop growing")
        else:
            _wait(lambda: proc.poll() is not None or _healthy(port), START_TIMEOUT_S, "the server to come up")
            if proc.poll() is not None:
                raise RuntimeError(f"{sc.name}: the twin exited with {proc.returncode}")
            if sc.end == "serve":
                for _ in range(3):
                    _generate(port)
            _wait(lambda: _settled(log), START_TIMEOUT_S, "the log to settle")
    finally:
        _stop(proc)  # also any child a dead main process left behind
    return log.read_text(encoding="utf-8", errors="replace"), status


def label(sc: Scenario, text: str, status: int | None) -> dict[str, Any]:
    """The label of one captured log (see the module docstring: what the twin did, not what is diagnosed)."""
    decisive = None
    if sc.decisive is not None:
        decisive = next((line for line in text.splitlines() if sc.decisive in line), None)
        if decisive is None:
            raise RuntimeError(f"{sc.name}: the decisive line ({sc.decisive!r}) is missing from the log")
    gpu = sc.gpu
    if sc.gpu_from_oom:
        m = GPU_IN_OOM.search(text)
        if m is None:
            raise RuntimeError(f"{sc.name}: no OOM line names a GPU")
        gpu = int(m.group(1))
    version = sc.env.get("DSV4LAB_TWIN_SGLANG_VERSION", "default release")
    how = f"exit status {status}" if status is not None else "stopped by the tool (SIGKILL to its process group)"
    run_env = " ".join(f"{k}={v}" for k, v in sc.env.items())
    fault = f"DSV4LAB_TWIN_FAULT={sc.fault} " if sc.fault else ""
    return {
        "source": (
            f"tools/twin_fault_logs.py: {fault}{run_env + ' ' if run_env else ''}DSV4LAB_TWIN_HARDWARE=tiny "
            f"DSV4LAB_TWIN_TIME_SCALE={SCALE} python -m dsv4lab.twin {' '.join(TINY)} {' '.join(sc.argv)}".rstrip()
        ),
        "engine": "sglang",
        "engine_version": f"dsv4lab twin ({version})",
        "kind": sc.kind,
        "outcome": sc.outcome,
        "phase": sc.phase,
        "runner": sc.runner,
        "gpu": gpu,
        "tried_gib": None,
        "free_gib": None,
        "total_gib": None,
        "decisive_line": decisive,
        "decisive_line_present": decisive is not None,
        "cause": sc.cause,
        "split": "twin",
        "notes": f"Whole log of one twin run ({how}).",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--out", type=Path, default=OUT, help=f"folder for the logs and labels (default {OUT})")
    names = [s.name for s in SCENARIOS]
    ap.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"run only these: {', '.join(names)}")
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    for sc in SCENARIOS:
        if ns.only and sc.name not in ns.only:
            continue
        with tempfile.TemporaryDirectory(prefix=f"twin-{sc.name}-") as tmp:
            text, status = run(sc, Path(tmp))
        data = label(sc, text, status)
        (ns.out / f"twin-{sc.name}.log").write_text(text, encoding="utf-8")
        (ns.out / f"twin-{sc.name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        print(f"twin-{sc.name}: {len(text.splitlines())} lines, {data['outcome']} / {data['phase']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
