"""Running SGLang's real ``bench_serving`` client (0.5.23) as the peer of a measurement, on a CPU machine.

``make test`` builds ``.cache/sglang-parsers/venv-0.5.23`` (``tools/sglang_parser_venvs.sh``): SGLang 0.5.23
with a CPU torch, the parser's deps, and what its benchmark client imports (transformers, tokenizers). Its
client module imports GPU-only packages on the way (triton; and ``datasets`` for MMMU), so it is started
through a small shim: the inert stand-ins of ``tools/sglang_argv_check.py`` for those packages, and the one
constant it takes from ``sglang.srt.disaggregation.utils`` (whose import chain reaches GPU kernels) — the
client's own code runs unchanged. A word-level tokenizer is written locally (``--tokenizer``), so nothing is
downloaded; ``HF_HUB_OFFLINE=1`` makes sure of it.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PEER = ROOT / ".cache" / "sglang-parsers" / "venv-0.5.23" / "bin" / "python"
MODULE = "sglang.benchmark.serving"

# Run SGLang's benchmark module as __main__ with GPU-only imports stood in (see the module docstring).
_SHIM = """
import gc, os, runpy, sys, types
if os.environ.get("DSV4LAB_PEER_GC_OFF") == "1":  # a diagnostic only (bench_parity.py --explain-gc)
    gc.disable()
sys.path.insert(0, {tools!r})
from sglang_argv_check import install_gpu_stand_ins
install_gpu_stand_ins(frozenset({{"triton", "torchvision", "datasets"}}))
disagg = types.ModuleType("sglang.srt.disaggregation.utils")
disagg.FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # the value in 0.5.23; only --fake-prefill uses it
sys.modules["sglang.srt.disaggregation.utils"] = disagg
sys.argv = [{module!r}, *sys.argv[1:]]
runpy.run_module({module!r}, run_name="__main__", alter_sys=True)
"""

# A word-level tokenizer: ids 3.. are the words w3, w4, ... (one token each, for the twin's count too).
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


@dataclass(frozen=True)
class Peer:
    """A usable peer: its interpreter, the shim that runs the client, a local tokenizer."""

    python: str
    shim: Path
    tokenizer: Path

    def argv(self, args: Sequence[str]) -> list[str]:
        return [self.python, str(self.shim), "--tokenizer", str(self.tokenizer), *args]


def find_peer(python: str | os.PathLike[str] | None, work: Path) -> tuple[Peer | None, str]:
    """The peer in ``python`` (default: the venv ``make test`` builds), or None and why not."""
    py = Path(python) if python is not None else DEFAULT_PEER
    if not py.exists():
        return None, f"no SGLang venv at {py} (make sglang-parsers builds it)"
    check = subprocess.run(
        # find_spec does not run sglang/__init__ (which imports GPU-only packages); the shim deals with those
        [str(py), "-c", "import importlib.util as u, transformers, tokenizers; assert u.find_spec('sglang')"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check.returncode != 0:
        tail = (check.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{py} cannot import SGLang's client deps ({tail}); rerun make sglang-parsers"
    shim = work / "sglang_bench_serving.py"
    shim.write_text(_SHIM.format(tools=str(ROOT / "tools"), module=MODULE))
    tok = work / "tiny-tokenizer"
    if not (tok / "tokenizer.json").exists():
        subprocess.run([str(py), "-c", _TOKENIZER, str(tok)], check=True, timeout=120)
    return Peer(str(py), shim, tok), ""


@dataclass(frozen=True)
class PeerRun:
    result: dict[str, Any]  # the last JSONL object it wrote
    stdout: str
    wall_s: float
    cpu_s: float  # the whole process, start-up (imports) included
    cpu_samples: tuple[tuple[float, float], ...] = ()  # (perf_counter, CPU seconds so far), every 50 ms


class CpuSampler:
    """Samples a process's CPU time (user + system) with ``time.perf_counter`` stamps, so the CPU it spent
    inside any window (e.g. from the first request to the last token, excluding start-up) can be read."""

    def __init__(self, pid: int, every_s: float = 0.05) -> None:
        self.samples: list[tuple[float, float]] = []
        self._proc = psutil.Process(pid)
        self._every = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                t = self._proc.cpu_times()
            except psutil.Error:
                return
            self.samples.append((time.perf_counter(), t.user + t.system))
            self._stop.wait(self._every)

    def stop(self) -> tuple[tuple[float, float], ...]:
        self._stop.set()
        self._thread.join(timeout=5)
        return tuple(self.samples)


def cpu_between(samples: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """CPU seconds spent between two perf_counter instants, interpolated between samples."""

    def at(t: float) -> float:
        if not samples:
            return 0.0
        if t <= samples[0][0]:
            return samples[0][1]
        for (t0, c0), (t1, c1) in itertools.pairwise(samples):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return samples[-1][1]

    return max(0.0, at(end) - at(start))


def run_peer(
    peer: Peer,
    args: Sequence[str],
    out_file: Path,
    *,
    core: int | None = None,
    timeout_s: float = 1800.0,
    gc_off: bool = False,
) -> PeerRun:
    """Run ``bench_serving`` with ``args`` (``--output-file`` is added) and return what it wrote. ``gc_off``
    disables its garbage collector (a diagnostic: with torch and transformers imported, one full collection
    in its process takes hundreds of ms on a slow core, and lands in whichever requests are in flight)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if gc_off:
        env["DSV4LAB_PEER_GC_OFF"] = "1"
    env.pop("PYTHONPATH", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        peer.argv([*args, "--output-file", str(out_file)]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=(lambda: os.sched_setaffinity(0, {core})) if core is not None else None,
    )
    sampler = CpuSampler(proc.pid)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=30)
        raise RuntimeError(f"SGLang's bench_serving did not finish within {timeout_s:g} s") from None
    samples = sampler.stop()
    wall = time.perf_counter() - t0
    cpu = samples[-1][1] if samples else 0.0
    if proc.returncode != 0 or not out_file.exists():
        raise RuntimeError(f"SGLang's bench_serving failed ({proc.returncode}):\n{stderr[-3000:]}")
    return PeerRun(json.loads(out_file.read_text().splitlines()[-1]), stdout, wall, cpu, samples)


if __name__ == "__main__":  # a quick check: python benchmarks/sglang_peer.py [--peer-python PY]
    import tempfile

    found, why = find_peer(sys.argv[2] if len(sys.argv) > 2 else None, Path(tempfile.mkdtemp()))
    print(f"peer: {found}" if found else f"no peer: {why}")
