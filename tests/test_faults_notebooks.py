"""Fault matrix for headless runs (papermill through ``dsv4lab run`` / ``dsv4lab campaign``): a kernel that
dies, a cell that raises, Ctrl-C in the middle of a benchmark, a campaign step that fails and the rerun that
resumes, two campaigns started on one host at once, and ``dsv4lab report`` rendering a run again."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from dsv4lab.cli.main import main
from tests.test_faults_support import (
    LAUNCH_TINY,
    alive,
    cli,
    cli_popen,
    signal_dispositions,
    wait_for,
    write_notebook,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def drill(tmp_path: Path) -> Path:
    """A notebook that starts a tiny twin server, then does what ``mode`` says."""
    return write_notebook(
        tmp_path / "drill.ipynb",
        "mode: str = 'ok'  # what goes wrong: die, error, bench",
        [
            LAUNCH_TINY,
            "if mode == 'die':  # the kernel is killed (out of memory, say)\n"
            "    import os, signal\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "if mode == 'error':\n"
            "    raise RuntimeError('a bug in the notebook')\n"
            "if mode == 'bench':\n"
            "    Path(run_dir, 'benching').write_text('go')\n"
            "    s.bench(concurrency=[2], prompts=200, input_len=64, output_len=2000)",
            "print('never reached')",
        ],
    )


def _only_run(reports: Path) -> Path:
    runs = [p for p in reports.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


#: How the notebook fails -> the words its error holds.
FAILURES = {"die": "DeadKernelError", "error": "RuntimeError: a bug"}


def test_a_dead_kernel_or_a_failing_cell_leaves_the_report_and_no_server(drill: Path, tmp_path: Path) -> None:
    # Both at once (two runs side by side, as two terminals would): a killed kernel, a cell that raises.
    procs = {
        mode: cli_popen(["run", str(drill), "-p", "mode", mode, "--reports", str(tmp_path / mode)]) for mode in FAILURES
    }
    for mode, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        words = FAILURES[mode]
        # Seen: one error line naming what failed and where the report is; the exit status of a failed notebook.
        assert proc.returncode == 10, err[-2000:]
        assert f"Error: notebook drill failed: {words}" in err or words in err
        run = _only_run(tmp_path / mode)
        assert out.strip() == str(run / "report.html")
        # Kept: the status, the executed notebook up to the failure, the report saying so, the server's files.
        results = json.loads((run / "results.json").read_text())
        assert results["status"] == "failed" and words.split(":")[0] in results["error"]
        executed = json.loads((run / "notebook.ipynb").read_text())  # whole, parseable
        outputs = [o for c in executed["cells"] for o in c.get("outputs", [])]
        assert any("READY" in "".join(o.get("text", "")) for o in outputs), (mode, outputs)
        html = (run / "report.html").read_text()
        assert "failed: see the failing cell" in html and words.split(":")[0] in html
        launcher = int(json.loads((run / "tiny" / "server.json").read_text())["launcher_pid"])
        assert (run / "tiny" / "server.log").is_file()
        # No server outlives the notebook: the runner stops what a dead kernel could not.
        wait_for(lambda pid=launcher: not alive(pid), "the notebook's server stopping", 30)  # type: ignore[misc]
        if mode == "die":
            assert results["stopped_servers"] == [str(run / "tiny")]


def test_ctrl_c_in_the_middle_of_a_benchmark_marks_the_run_interrupted_and_keeps_the_report(
    drill: Path, tmp_path: Path
) -> None:
    reports = tmp_path / "reports"
    proc = cli_popen(["run", str(drill), "-p", "mode", "bench", "--reports", str(reports)])
    try:
        wait_for(lambda: list(reports.glob("*/benching")), "the benchmark starting", 120)
        time.sleep(1.0)
        dispositions = signal_dispositions(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the runner and its kernel get it
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    # Seen: "Interrupted", where the report is, exit 130.
    assert proc.returncode == 130, (dispositions, err[-2000:])
    assert "Interrupted: notebook drill stopped by the user" in err
    run = _only_run(reports)
    assert out.strip().splitlines()[-1] == str(run / "report.html")
    # Kept: status interrupted, the report with that status, the partial benchmark; no server left.
    results = json.loads((run / "results.json").read_text())
    assert results["status"] == "interrupted"
    html = (run / "report.html").read_text()
    assert "interrupted: stopped by the user" in html
    stored = (run / "tiny" / "bench" / "bench_results.jsonl").read_text().splitlines()
    assert stored and json.loads(stored[-1])["partial"] is True
    record = json.loads((run / "tiny" / "server.json").read_text())
    wait_for(lambda: not alive(int(record["launcher_pid"])), "the notebook's server stopping", 30)


# -- campaigns ------------------------------------------------------------------------------------------------


def _campaign(tmp_path: Path, name: str, steps: str) -> Path:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(f'[campaign]\nname = "{name}"\ntitle = "Fault drill"\n\n[parameters]\n\n{steps}')
    return spec


@pytest.fixture
def state_dir(tmp_path: Path) -> dict[str, str]:
    """Host locks and port reservations of these campaigns in a folder of their own."""
    folder = tmp_path / "state"
    folder.mkdir()
    return {"DSV4LAB_STATE_DIR": str(folder)}


def test_a_failed_step_is_rerun_and_finished_steps_are_reused(
    tmp_path: Path, state_dir: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    record = write_notebook(
        tmp_path / "record.ipynb",
        "value: int = 1  # what to record",
        [
            "from dsv4lab.notebook.experiment import Experiment\n"
            "exp = Experiment.from_namespace(globals())\n"
            "exp.record(value=value * 2)\n"
            "print('recorded', value * 2)"
        ],
        title="Record a value",
    )
    flaky = write_notebook(
        tmp_path / "flaky.ipynb",
        "value: int = 0  # from the step before\nfault: str = ''  # the kernel dies while this file exists",
        [
            "import os, signal\n"
            "from dsv4lab.notebook.experiment import Experiment\n"
            "if fault and os.path.exists(fault):\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "exp = Experiment.from_namespace(globals())\n"
            "exp.record(value=value + 1)"
        ],
        title="A step that can die",
    )
    fault = tmp_path / "fault-on"
    fault.write_text("the kernel of step two dies")
    spec = _campaign(
        tmp_path,
        "drill",
        f'[[step]]\nid = "one"\nnotebook = "{record.name}"\nparameters = {{ value = 5 }}\n\n'
        f'[[step]]\nid = "two"\nnotebook = "{flaky.name}"\nparameters = {{ fault = "{fault}" }}\n'
        'inputs = { value = "one.value" }\n',
    )
    reports = tmp_path / "reports"
    first = cli(["campaign", str(spec), "--reports", str(reports)], env=state_dir)
    # Seen: the campaign stops at the failed step, says which, and where the index is.
    assert first.returncode == 10, first.stderr[-2000:]
    assert "campaign drill stopped" in first.stderr and "DeadKernelError" in first.stderr
    folder = reports / "drill"
    index = folder / "index.html"
    assert first.stdout.strip() == str(index)
    state = json.loads((folder / "campaign.json").read_text())["steps"]
    assert state["one"]["status"] == "ok" and state["two"]["status"] == "failed"
    # Kept: the finished step's run, the failed step's report.
    one_dir = Path(state["one"]["run_dir"])
    assert json.loads((one_dir / "results.json").read_text())["figures"]["value"] == 10
    assert (Path(state["two"]["run_dir"]) / "report.html").is_file()
    # The rerun, with the fault gone: step one is reused (not run again), the failed step two runs again.
    fault.unlink()
    second = cli(["campaign", str(spec), "--reports", str(reports)], env=state_dir)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "[one]" not in second.stderr and "[two]" in second.stderr and "reused" in second.stderr
    state = json.loads((folder / "campaign.json").read_text())["steps"]
    assert Path(state["one"]["run_dir"]) == one_dir
    assert {k: v["status"] for k, v in state.items()} == {"one": "ok", "two": "ok"}
    assert json.loads((Path(state["two"]["run_dir"]) / "results.json").read_text())["figures"]["value"] == 11
    run_dirs = sorted(p.name.split("-", 2)[-1] for p in folder.iterdir() if p.is_dir())
    assert run_dirs == ["flaky", "flaky", "record"]  # one run of step one, two of step two
    # `dsv4lab report` writes the index and a step's report again, running nothing.
    index.unlink()
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0 and capsys.readouterr().out.strip() == str(index)
    page = index.read_text()
    assert all(f">{step}<" in page for step in ("one", "two")) and "Fault drill" in page
    step_report = Path(state["two"]["run_dir"]) / "report.html"
    before = step_report.read_text()
    step_report.unlink()
    assert main(["report", str(step_report.parent)]) == 0 and capsys.readouterr().out.strip() == str(step_report)
    assert _provenance(step_report.read_text()) == _provenance(before)
    assert main(["report", str(tmp_path)]) == 2  # not a run dir: one clear error
    assert "Error: PATH=" in capsys.readouterr().err


def _provenance(html: str) -> str:
    start = html.index("<table")
    return html[start : html.index("</table>", start)]


def test_two_campaigns_on_one_host_at_once_are_refused_not_interleaved(
    tmp_path: Path, state_dir: dict[str, str]
) -> None:
    slow = write_notebook(
        tmp_path / "slow.ipynb",
        "hold_s: float = 1.0  # how long this step holds the host at most",
        [
            "import time\nfrom pathlib import Path\nPath(run_dir, 'holding').write_text('yes')\n"
            # Held until the test says so (a fixed sleep ran out on a loaded machine before the second
            # campaign's process had even started).
            "release = Path(run_dir).parent / 'release'\ndeadline = time.monotonic() + hold_s\n"
            "while time.monotonic() < deadline and not release.exists():\n    time.sleep(0.05)"
        ],
        title="Hold the host",
    )
    steps = f'[[step]]\nid = "hold"\nnotebook = "{slow.name}"\nparameters = {{ hold_s = 120.0 }}\n'
    first_spec = _campaign(tmp_path, "first", steps)
    second_spec = _campaign(tmp_path, "second", steps)
    reports = tmp_path / "reports"
    first = cli_popen(["campaign", str(first_spec), "--reports", str(reports)], env=state_dir)
    try:
        wait_for(lambda: list((reports / "first").glob("*/holding")), "the first campaign running", 120)
        # Another campaign on the same host: refused at once, naming who holds the host; it ran nothing.
        other = cli(["campaign", str(second_spec), "--reports", str(reports)], env=state_dir, timeout_s=60)
        assert other.returncode == 6, other.stderr
        assert "host local is in use by campaign 'first'" in other.stderr and f"PID {first.pid}" in other.stderr
        assert not (reports / "second" / "campaign.json").exists()
        assert not [p for p in (reports / "second").iterdir() if p.is_dir()]
        # The same campaign again, into the same folder: refused too.
        same = cli(["campaign", str(first_spec), "--reports", str(reports)], env=state_dir, timeout_s=60)
        assert same.returncode == 6 and "is in use by campaign 'first'" in same.stderr
        (reports / "first" / "release").write_text("go")
        _, err = first.communicate(timeout=120)
        (reports / "first" / "release").unlink()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(timeout=10)
    # The first one was not disturbed, and it let go of the host when it finished.
    assert first.returncode == 0, err[-2000:]
    assert json.loads((reports / "first" / "campaign.json").read_text())["steps"]["hold"]["status"] == "ok"
    assert not (Path(state_dir["DSV4LAB_STATE_DIR"]) / "campaign.lock").exists()
    assert not (reports / "first" / "campaign.lock").exists()
    # A campaign killed outright leaves its lock behind; the next one from this machine takes it over.
    # (Held 8 s at most: SIGKILL leaves the campaign's kernel running, and it must not outlive the test.)
    first_spec = _campaign(tmp_path, "first", steps.replace("hold_s = 120.0", "hold_s = 8.0"))
    killed = cli_popen(["campaign", str(first_spec), "--reports", str(reports), "--force"], env=state_dir)
    wait_for(lambda: len(list((reports / "first").glob("*/holding"))) == 2, "the campaign running again", 120)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    assert (Path(state_dir["DSV4LAB_STATE_DIR"]) / "campaign.lock").exists()
    fast = _campaign(tmp_path, "third", steps.replace("hold_s = 120.0", "hold_s = 0.0"))
    after = cli(["campaign", str(fast), "--reports", str(reports)], env=state_dir)
    assert after.returncode == 0, after.stderr[-2000:]
