"""``Lab(target="vllm")`` in a real Jupyter kernel, over the loopback sshd, against a REAL vLLM.

One server for the module (start-up costs ~40-90 s here): the kernel's ``Lab`` reaches this machine as an
SSH alias (``host="gpubox"``, keys and known_hosts of its own), launches ``vllm serve`` there, watches it
to READY, benchmarks it through the SSH tunnel, and is stopped in the middle of a benchmark with the
kernel's Stop: control comes back within the bound, the finished requests are kept, the server runs on.
Then the API server is SIGKILLed mid-benchmark: a partial result, a CRASHED verdict, nothing of the
server's process group alive. ``lab.close()`` leaves no process behind.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import require
from tests.kernel import Kernel
from tests.sshd import SSHD
from tests.test_kernel_interrupt import BACK_WITHIN_S
from tests.vllmserver import (
    HELPERS,
    VENV,
    gone,
    make_tiny_model,
    roles,
    served_requests,
    vllm_available,
    wait_for_requests,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

ROOT = Path(__file__).resolve().parent.parent
ALIAS = "gpubox"
#: Start-up is ~40 s on two idle cores with --enforce-eager, several times that beside a busy suite.
READY_TIMEOUT_S = 420

SETUP = """
import sys, os, signal
from dsv4lab import Lab
from dsv4lab.config import VllmConfig
lab = Lab({alias!r}, target="vllm", python={python!r}, run_root={root!r}, remote_root={remote!r},
          progress=False)
cfg = VllmConfig(model_path={model!r}, max_model_len=1024, dtype="float32", enforce_eager=True,
                 env={{"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}})
"""


@pytest.fixture(scope="module")
def kernel(sshd: SSHD, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    require(vllm_available(), f"the vLLM CPU venv at {VENV} (make vllm-cpu)")
    tmp = tmp_path_factory.mktemp("vllm-lab")
    model, _vocab = make_tiny_model(tmp / "model")
    home = tmp / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text(
        f"Host {ALIAS}\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
        f"  IdentityFile {sshd.key_path}\n  IdentitiesOnly yes\n  UserKnownHostsFile {sshd.known_hosts}\n"
    )
    (home / ".ssh" / "known_hosts").write_text(sshd.host_key_line + "\n")
    state = tmp / "state"
    state.mkdir()
    env = {"HOME": str(home), "PYTHONPATH": str(ROOT), "DSV4LAB_STATE_DIR": str(state), "SSH_AUTH_SOCK": ""}
    k = Kernel(tmp, env=env)
    setup = SETUP.format(
        alias=ALIAS,
        python=str(VENV / "bin" / "python"),
        root=str(tmp / "runs"),
        remote=str(tmp / "remote"),
        model=str(model),
    )
    try:
        k.run(setup, timeout_s=60)
        yield k
    finally:
        try:
            k.run("lab.close()", timeout_s=120)
        finally:
            k.shutdown(now=True)


@pytest.mark.timeout(READY_TIMEOUT_S + 300)
def test_a_vllm_lab_over_ssh_launches_benches_and_stops_in_a_kernel(kernel: Kernel) -> None:
    kernel.run(f"s = lab.launch(cfg, name='tiny').wait(timeout_s={READY_TIMEOUT_S})", timeout_s=READY_TIMEOUT_S + 60)
    assert kernel.value("s.state") == "'READY'", kernel.value("s.readiness.reason")
    assert kernel.value("s.url != f'http://127.0.0.1:{s.port}'") == "True"  # through the SSH tunnel
    pgid = int(kernel.value("s.handle.launcher_pid"))
    assert roles(pgid) >= HELPERS, roles(pgid)

    # Stop during a benchmark: control back within the bound, the cut run kept with what finished.
    port = int(kernel.value("s.port"))
    done_before = served_requests(port)
    cell = kernel.submit("runs = s.bench(concurrency=[4], prompts=400, input_len=64, output_len=64)")
    wait_for_requests(port, done_before + 6)  # the warmup and the first waves are done: the run is under way
    pressed = kernel.interrupt()
    result = kernel.collect(cell, timeout_s=60)
    assert result.status == "error" and result.ename == "Interrupted", (result.ename, result.evalue)
    assert result.replied_at - pressed < BACK_WITHIN_S
    assert kernel.value("s.runs[-1].partial and s.runs[-1].interrupted") == "True"
    assert int(kernel.value("s.runs[-1].summary.completed")) >= 1
    assert kernel.value("s.runs[-1].provenance.engine") == "'vllm'"
    assert kernel.value("s.is_alive()") == "True"  # a Stopped bench leaves the server it did not start

    # SIGKILL of the API server in the middle of a benchmark: partial, CRASHED, no helper left alive.
    api = int(kernel.value("s.handle.server_pid()"))  # asked before the cell: a busy kernel answers after it
    done_before = served_requests(port)
    cell = kernel.submit("runs2 = s.bench(concurrency=[4], prompts=400, input_len=64, output_len=64)")
    wait_for_requests(port, done_before + 6)
    os.kill(api, 9)
    killed = time.monotonic()
    done = kernel.collect(cell, timeout_s=120)
    print(f"the benchmark came back {done.replied_at - killed:.1f} s after the kill")
    assert done.status == "ok", (done.ename, done.evalue)
    assert kernel.value("runs2.partial") == "True"
    assert kernel.value("s.readiness.verdict.value") == "'CRASHED'", kernel.value("s.readiness.reason")
    assert not gone(pgid), "vLLM's EngineCore / worker outlived the killed API server"
