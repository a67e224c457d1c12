"""The probe notebook of the notebook-API issue, as a user writes it now: a few obvious lines per step,
executed by papermill on a real kernel against the twin."""

from __future__ import annotations

from pathlib import Path

import nbformat
import papermill
import pytest

from dsv4lab.notebook.nbrun import IOPUB_TIMEOUT_S
from tests.test_faults_support import no_processes_left

pytestmark = pytest.mark.slow

CELLS = [
    ("parameters", 'host = "local"  # an SSH alias\npace = 0.05  # twin only\nconcurrency = "1,4"'),
    ("", "from dsv4lab import Lab\nlab = Lab(host=host, pace=pace, run_root='runs')"),
    ("", 'lab.preflight("config_b")'),
    ("", 'b = lab.launch("config_b").wait()\nb'),
    ("", 'a = lab.launch("config_a").wait()\nruns = a.bench(concurrency, input_len=256, output_len=16)\nruns'),
    ("", "frame = runs.to_frame()\nassert frame['concurrency'].tolist() == [1, 4]\nassert b.state == 'CRASHED'"),
    ("", "lab.close()"),
]


def test_probe_notebook_runs_under_papermill(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    for tag, source in CELLS:
        cell = nbformat.v4.new_code_cell(source)  # type: ignore[no-untyped-call]
        if tag:
            cell.metadata["tags"] = [tag]
        nb.cells.append(cell)
    steps = [line for _, src in CELLS[1:5] for line in src.splitlines() if line.strip()]
    assert len(steps) <= 8  # launch + wait + bench took ~16 lines and 8 imports; now 1 import and a line a step
    out = tmp_path / "probe.out.ipynb"
    executed = papermill.execute_notebook(
        nb,
        str(out),
        parameters={"concurrency": "1,4"},
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
        iopub_timeout=IOPUB_TIMEOUT_S,  # nbclient's 4 s drops outputs on a loaded CI machine
    )
    assert not executed.metadata.papermill.exception
    text = out.read_text()
    assert "CRASHED" in text and "memory preflight" in text and "benchmark runs" in text
    assert "unpkg.com" not in text and "application/vnd.jupyter.widget" not in text  # nothing needs a CDN
    # The kernel's exit stopped what the notebook started (no lab.close() in it). Zombies do not count: a
    # container's PID 1 may never reap the reparented twin processes.
    for run_dir in sorted((tmp_path / "runs").iterdir()):
        no_processes_left(run_dir)
