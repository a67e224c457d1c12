"""Stop means stop, in a real Jupyter kernel: each blocking call gives control back within 2 s of the Stop
button, keeps its partial result, and no server outlives the session."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.kernel import CellResult, Kernel
from tests.test_faults_support import no_processes_left, processes_of, wait_for

pytestmark = pytest.mark.slow

#: The issue's bound: control back within 2 s of Stop (the design aims for ~1 s).
BACK_WITHIN_S = 2.0

SETUP = """
import sys
from dsv4lab import Lab, bench
lab = Lab(run_root={root!r}, pace=0.05, progress=False)
"""


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    k = Kernel(tmp_path)
    k.run(SETUP.format(root=str(tmp_path / "runs")))
    yield k
    try:
        k.run("lab.close()", timeout_s=60)
    finally:
        k.shutdown(now=True)


def _wait_output(k: Kernel, path: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _gone(pid: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.05)
    return False


def _press_stop(k: Kernel, cell: str) -> CellResult:
    """Press Stop during ``cell``: it ends in ``Interrupted`` within the bound, shown as the short stop
    block (no library traceback); its result for the details."""
    pressed = k.interrupt()
    result = k.collect(cell, timeout_s=60)
    assert result.status == "error" and result.ename == "Interrupted", (result.ename, result.evalue)
    assert result.replied_at - pressed < BACK_WITHIN_S
    shown = "\n".join(result.traceback)
    assert shown.startswith("Stopped by the user: "), shown
    assert len(shown.splitlines()) <= 3, shown
    for library_trace in ("Traceback", "File ", "site-packages", "dsv4lab/", "\x1b["):
        assert library_trace not in shown, shown
    return result


def _kept_at(result: CellResult) -> list[str]:
    """The ways the stop block names to reach the partial result (``a.runs  or  sys.last_value.partial``)."""
    kept = [line for line in result.traceback if line.startswith("Kept (the cell's assignment did not run): ")]
    assert len(kept) == 1, result.traceback
    return kept[0].split(" in ", 1)[1].split("  or  ")


def _assert_reaches_the_partial(k: Kernel, result: CellResult) -> list[str]:
    """Each way the block names, typed into the next cell as shown, gives the partial result itself."""
    ways = _kept_at(result)
    assert ways[-1].endswith("sys.last_value.partial"), ways
    for way in ways:
        *setup, expression = way.split("; ")
        k.run("\n".join([*setup, f"_reached = {expression}"]))
        same = "_reached is p or (hasattr(p, '__len__') and [id(r) for r in _reached] == [id(r) for r in p])"
        assert k.value(f"(lambda p: {same})(sys.last_value.partial)") == "True", way
    return ways


def test_stop_during_server_bench_keeps_the_partial_run(kernel: Kernel) -> None:
    kernel.run('a = lab.launch("config_a").wait()', timeout_s=120)
    assert kernel.value("a.state") == "'READY'"
    # 10 waves of 4 requests, about 4.4 s each on the twin: the first wave is done when Stop is pressed.
    cell = kernel.submit("runs = a.bench(concurrency=[4], prompts=40, input_len=256, output_len=300)")
    time.sleep(7.0)
    result = _press_stop(kernel, cell)
    # What stopped, after what, where the result is: the block a user reads instead of a traceback.
    shown = result.traceback[0]
    assert shown.startswith("Stopped by the user: sweep config-a at c=4, after 0 of 1 run; the cut run (c=4) had "), (
        shown
    )
    assert " of 40 requests ok (" in shown and shown.endswith(" s)."), shown
    assert _assert_reaches_the_partial(kernel, result) == ["a.runs", "sys.last_value.partial"]
    assert kernel.value("len(a.runs)") == "1"
    assert kernel.value("a.runs[-1].partial and a.runs[-1].interrupted") == "True"
    assert kernel.value("a.runs[-1].abort_reason") == "'interrupted by the user'"
    assert int(kernel.value("a.runs[-1].summary.completed")) >= 1  # what finished is kept
    assert kernel.value("sys.last_value.partial is not None") == "True"
    assert kernel.value("a.is_alive()") == "True"  # a bench does not stop the server it did not start
    stored = kernel.value("len(open(a.local_dir / 'bench' / 'bench_results.jsonl').readlines())")
    assert stored == "1"
    # The function underneath, as a script would call it: the same Stop, the partial result on the exception.
    cell = kernel.submit(
        "wl = bench.random_workload(40, 256, 300, seed=5)\n"
        "r = bench.run(a.url, wl, bench.LoadSpec(concurrency=4, warmup=0))"
    )
    time.sleep(7.0)
    result = _press_stop(kernel, cell)
    assert result.traceback[0].startswith("Stopped by the user: benchmark c=4, after "), result.traceback
    assert _assert_reaches_the_partial(kernel, result) == ["sys.last_value.partial"]
    assert kernel.value("type(sys.last_value.partial).__name__") == "'BenchResult'"
    assert (
        kernel.value("sys.last_value.partial.interrupted and sys.last_value.partial.summary.completed >= 1") == "True"
    )


def test_stop_during_wait_ready_stops_the_server(kernel: Kernel) -> None:
    kernel.run('s = lab.launch("config_a", fault="slow_start:40")')
    pid = int(kernel.value("s.handle.launcher_pid"))
    cell = kernel.submit("s.wait()")
    time.sleep(2.0)
    result = _press_stop(kernel, cell)
    assert result.traceback[1] == "The server was stopped.", result.traceback
    assert _assert_reaches_the_partial(kernel, result) == ["s.readiness", "sys.last_value.partial"]
    assert kernel.value("s.readiness.verdict.value") == "'INTERRUPTED'"
    assert kernel.value("len(s.readiness.timeline) > 0") == "True"  # the phases seen so far are kept
    assert _gone(pid), "the server the watch started outlived the Stop"


def test_stop_during_sweep_hands_back_the_finished_runs(kernel: Kernel, tmp_path: Path) -> None:
    kernel.run('a = lab.launch("config_a").wait()', timeout_s=120)
    marker = tmp_path / "started"
    code = (
        "wl = bench.random_workload(8, 256, 40, seed=3)\n"
        f"open({str(marker)!r}, 'w').write('go')\n"
        "runs = bench.sweep(a.url, lambda c: wl if c == 1 else bench.random_workload(40, 256, 3000, seed=3),"
        " [1, 8], progress=False)"
    )
    kernel.run("del sys")  # a notebook that never imported sys is told how to reach the result
    cell = kernel.submit(code)
    _wait_output(kernel, marker)
    time.sleep(6.0)  # the c=1 run (8 short requests) is done by now; the c=8 run is long
    result = _press_stop(kernel, cell)
    assert result.traceback[0].startswith("Stopped by the user: sweep at c=1, 8, after 1 of 2 runs; the cut run (c=8)")
    assert _assert_reaches_the_partial(kernel, result) == ["import sys; sys.last_value.partial"]
    partial = "sys.last_value.partial"
    assert kernel.value(f"type({partial}).__name__") == "'BenchRuns'"
    assert kernel.value(f"[r.concurrency for r in {partial}]") == "[1, 8]"
    assert kernel.value(f"[r.partial for r in {partial}]") == "[False, True]"
    assert kernel.value(f"{partial}.to_frame()['interrupted'].tolist()") == "[False, True]"


def test_a_failing_cell_and_a_kernel_restart_leave_no_server(tmp_path: Path) -> None:
    k = Kernel(tmp_path)
    try:
        k.run(SETUP.format(root=str(tmp_path / "runs")))
        k.run('a = lab.launch("config_a").wait()', timeout_s=120)
        pid = int(k.value("a.handle.launcher_pid"))
        failing = k.collect(k.submit("a.bench(concurrency='one, two')"))
        assert failing.status == "error" and failing.ename == "BenchError"
        assert "concurrency levels must be integers" in (failing.evalue or "")
        assert psutil.pid_exists(pid)  # a failing cell is no reason to stop: the session still owns it
        k.km.restart_kernel(now=False)  # JupyterLab's "Restart kernel": a graceful shutdown first
        assert _gone(pid), "a restarted kernel left its server running"
    finally:
        k.shutdown(now=True)


def test_stop_during_a_comparison_keeps_the_runs_and_stops_both_servers(kernel: Kernel, tmp_path: Path) -> None:
    # lab.launch_ab launches both configs for the A/B and interleaves A, B, A, B on the twin.
    cell = kernel.submit(
        'ab = lab.launch_ab("config_a", "config_b_fixed", [4], repeats=3, prompts=8, input_len=256, output_len=300)'
    )
    stores = tmp_path / "runs"
    deadline = time.monotonic() + 180
    while not any(p.read_text().strip() for p in stores.glob("ab-*/bench_results.jsonl")):
        if time.monotonic() > deadline:  # say what the cell did instead (an error it raised, its output)
            kernel.interrupt()
            r = kernel.collect(cell, timeout_s=60)
            raise AssertionError(
                f"the comparison never finished a run: {r.status} {r.ename}: {r.evalue}\n"
                f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{r.traceback}"
            )
        time.sleep(0.1)
    result = _press_stop(kernel, cell)
    assert result.traceback[0].startswith("Stopped by the user: comparison config_b_fixed vs config_a, after "), (
        result.traceback
    )
    assert " of 6 runs" in result.traceback[0] and result.traceback[1] == "Both servers are being stopped."
    _assert_reaches_the_partial(kernel, result)
    partial = "sys.last_value.partial"
    assert kernel.value(f"type({partial}).__name__") == "'ABRuns'"
    assert int(kernel.value(f"len({partial}.a) + len({partial}.b)")) >= 1
    # A run cut by Stop is there and marked (Stop can also land between two runs: then none is cut).
    assert kernel.value(f"all(r.interrupted == r.partial for r in (*{partial}.a, *{partial}.b))") == "True"
    for run_dir in sorted(p for p in stores.iterdir() if p.is_dir()):
        no_processes_left(run_dir)  # both servers were started for the comparison: both are stopped


def test_stop_during_profiling_keeps_the_load_run(kernel: Kernel) -> None:
    kernel.run('a = lab.launch("config_a", sample_gpus=False).wait()', timeout_s=120)
    cell = kernel.submit("k = a.profile(4, prompts=40, input_len=256, output_len=300)")
    time.sleep(6.0)
    result = _press_stop(kernel, cell)
    assert "asked to stop profiling" in (result.evalue or "")
    assert _assert_reaches_the_partial(kernel, result) == ["a.runs[-1]", "sys.last_value.partial"]
    assert kernel.value("a.runs[-1].interrupted and a.runs[-1].summary.completed >= 1") == "True"
    assert kernel.value("sys.last_value.partial is a.runs[-1]") == "True"
    assert kernel.value("a.is_alive()") == "True"  # profiling a server does not stop it


def test_stop_during_a_remote_bench_serving_kills_it(kernel: Kernel, tmp_path: Path) -> None:
    # SGLang's own client on the server host, here a stand-in module that takes its time (the real one
    # needs the model's tokenizer); what matters is the process tree on the host.
    site = tmp_path / "site"
    module = site / "sglang" / "benchmark" / "serving.py"
    module.parent.mkdir(parents=True)
    (site / "sglang" / "__init__.py").touch()
    (module.parent / "__init__.py").touch()
    module.write_text("import time\ntime.sleep(300)\n")
    cell = kernel.submit(
        "from dsv4lab.hosts import LocalHost\n"
        f"python = ['env', 'PYTHONPATH={site}', sys.executable]\n"
        "r = bench.run_remote(LocalHost(), 'http://127.0.0.1:9', bench.random_workload(4, 64, 4, seed=1),"
        f" work_dir={str(tmp_path / 'work')!r}, sglang_version='0.5.23', python=python, timeout_s=600)"
    )
    wait_for(lambda: processes_of(site), "the remote client to start", timeout_s=60)
    result = _press_stop(kernel, cell)
    assert "process tree is being killed" in (result.evalue or "")
    no_processes_left(site)
