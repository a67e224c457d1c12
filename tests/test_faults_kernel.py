"""Fault matrix in a real Jupyter kernel: Stop pressed in the middle of a launch, and a kernel restarted while
its server runs (the run dir re-attaches: the server is neither lost nor orphaned, and its state is the
state now)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab.cli.main import main
from tests.kernel import Kernel
from tests.test_faults_support import SCALE, alive, kill_tree_now, no_processes_left, wait_for

pytestmark = pytest.mark.slow

SETUP = f"""
import sys
from dsv4lab import Lab
from dsv4lab.config.server_config import ServerConfig
cfg = ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, mem_fraction_static=0.8)
lab = Lab(run_root={{root!r}}, hardware="tiny", pace={SCALE}, progress=False)
"""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(tmp_path)
    yield k
    k.shutdown(now=True)


def test_stop_in_the_middle_of_a_launch_leaves_no_server_and_marks_the_run(kernel: Kernel, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    kernel.run(SETUP.format(root=str(root)))
    cell = kernel.submit('s = lab.launch(cfg, name="half", wait=True)')
    # Stop as soon as the launch script runs: the launch itself, or the watch right after it, is cut.
    wait_for(lambda: (root / "half" / "launcher.pid").exists(), "the launch script starting", 60, every_s=0.005)
    pressed = kernel.interrupt()
    result = kernel.collect(cell, timeout_s=60)
    # Seen: the cell stops within seconds, as Interrupted.
    assert result.status == "error" and result.ename == "Interrupted", (result.ename, result.evalue)
    assert result.replied_at - pressed < 5.0
    # Kept: the run dir says it was interrupted; nothing of it runs any more.
    readiness = json.loads((root / "half" / "readiness.json").read_text())
    assert readiness["verdict"] == "INTERRUPTED" and "stop" in readiness["reason"]
    no_processes_left(root / "half")
    # The session goes on: the next launch in the same kernel works.
    kernel.run('t = lab.launch(cfg, name="after").wait(timeout_s=60)', timeout_s=120)
    assert kernel.value("t.state") == "'READY'"
    kernel.run("lab.close()", timeout_s=60)
    no_processes_left(root)


def test_a_restarted_kernel_reattaches_to_the_server_as_it_is_now(
    kernel: Kernel, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "runs"
    kernel.run(SETUP.format(root=str(root)))
    kernel.run('s = lab.launch(cfg, name="kept", keep=True).wait(timeout_s=60)', timeout_s=120)
    assert kernel.value("s.state") == "'READY'"
    run_dir = root / "kept"
    launcher = int(kernel.value("s.handle.launcher_pid"))
    kernel.km.restart_kernel(now=False)  # JupyterLab's "Restart kernel"
    kernel.kc.wait_for_ready(timeout=120)
    assert alive(launcher), "a kept server must survive the kernel restart"
    # The new kernel finds it from the run dir alone and sees it READY, then measures on it.
    kernel.run(SETUP.format(root=str(tmp_path / "second")))
    kernel.run(f"a = lab.attach({str(run_dir)!r})", timeout_s=60)
    assert kernel.value("a.state") == "'READY'"
    kernel.run("runs = a.bench(concurrency=[2], input_len=64, output_len=16)", timeout_s=120)
    assert kernel.value("runs.partial") == "False"
    # The server dies while nobody watches; attaching again says so (never READY from old log lines).
    server_pid = int((run_dir / "server.pid").read_text())
    kill_tree_now(server_pid)
    wait_for(lambda: (run_dir / "server.exit").exists(), "the launch script recording the exit", 30)
    kernel.run(f"b = lab.attach({str(run_dir)!r})", timeout_s=60)
    assert kernel.value("b.state") == "'CRASHED'"
    assert kernel.value("b.readiness.exit_status") == "137"
    assert json.loads((run_dir / "readiness.json").read_text())["verdict"] == "CRASHED"
    capsys.readouterr()
    assert main(["watch", str(run_dir), "--json", "--timeout", "20"]) == 1
    assert json.loads(capsys.readouterr().out)["verdict"] == "CRASHED"
    kernel.run("lab.close()", timeout_s=60)
    no_processes_left(run_dir)
