"""Fault matrix: the disk of the results folder fills up. Every result file is whole or absent (never half
written), the user is told which files could not be kept, and ``dsv4lab report`` renders the report once
there is room again. A real full disk: a small tmpfs mounted for the test (root only; under CI=true a
missing mount fails instead of skipping)."""

from __future__ import annotations

import json
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from dsv4lab import Lab
from dsv4lab.errors import HostError
from tests.conftest import require
from tests.test_faults_support import (
    SCALE,
    cli,
    kill_tree_now,
    no_processes_left,
    tiny_config,
    wait_for,
    write_notebook,
)

pytestmark = pytest.mark.slow


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB filesystem of its own (tmpfs), unmounted after the test."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    require(done.returncode == 0, f"a small tmpfs for a full disk (mount needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True, timeout=30, check=False).returncode:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30, check=False)


def fill(folder: Path, leave: int = 0) -> Path:
    """Fill the filesystem of ``folder`` until ``leave`` bytes are free."""
    ballast = folder / "ballast"
    with ballast.open("wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(folder).free - leave))
    return ballast


def half_written(folder: Path) -> list[Path]:
    """Temp files a write left behind (what "whole or absent" rules out)."""
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp") or ".json." in p.name]


def test_a_notebook_that_fills_the_disk_keeps_whole_files_and_says_what_was_not_written(
    small_disk: Path, tmp_path: Path
) -> None:
    nb = write_notebook(
        tmp_path / "fill.ipynb",
        "leave: int = 0  # bytes to leave free",
        [
            "from dsv4lab.notebook.experiment import Experiment\n"
            "exp = Experiment.from_namespace(globals())\n"
            "exp.record(answer=42)\n"
            "print('recorded')",
            "import os, shutil\n"
            "with open(os.path.join(run_dir, 'ballast'), 'wb') as f:\n"
            "    f.write(bytes(max(0, shutil.disk_usage(run_dir).free - leave)))",
            "print('after the disk filled: ' + 'x' * 20000)",
        ],
        title="The disk fills up",
    )
    reports = small_disk / "reports"
    out = cli(["run", str(nb), "-p", "leave", "2000", "--reports", str(reports)])
    # Seen: what failed, which record files could not be written, and how to render the report later.
    assert out.returncode == 10, out.stderr[-2000:]
    assert "No space left on device" in out.stderr and "its record in" in out.stderr
    assert "could not write results.json" in out.stderr and "report.html" in out.stderr
    run = next(reports.iterdir())
    assert f"dsv4lab report {run}" in out.stderr and "Traceback" not in out.stderr
    # Kept: whole files only -- the executed notebook as last saved, results.json as last written, no report.
    executed = json.loads((run / "notebook.ipynb").read_text())
    outputs = "".join(str(o) for c in executed["cells"] for o in c.get("outputs", []))
    assert "recorded" in outputs
    assert json.loads((run / "results.json").read_text())["figures"] == {"answer": 42}
    assert not (run / "report.html").exists()
    assert half_written(run) == []
    # Once there is room again, the report is rendered from what was kept, saying the record is unfinished.
    (run / "ballast").unlink()
    again = cli(["report", str(run)])
    assert again.returncode == 0, again.stderr
    html = (run / "report.html").read_text()
    assert "recorded" in html and "results.json records no status" in html


def test_a_full_disk_under_a_running_session_loses_no_verdict_half_way(small_disk: Path) -> None:
    lab = Lab(run_root=small_disk / "runs", hardware="tiny", pace=SCALE, progress=False)
    with lab:
        s = lab.launch(tiny_config(), name="full", sample_gpus=False).wait(timeout_s=60)
        assert s.state == "READY"
        ballast = fill(small_disk)
        # The server dies while the disk is full: the verdict is in memory, the user is warned that it could
        # not be saved, and readiness.json is still the last whole one.
        server_pid = s.handle.server_pid()
        assert server_pid is not None
        kill_tree_now(server_pid)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            s.wait(timeout_s=30)
        assert s.state == "CRASHED"
        assert any("could not save readiness.json" in str(w.message) for w in caught), caught
        assert json.loads((s.local_dir / "readiness.json").read_text())["verdict"] == "READY"
        # (The launch script's own `server.exit.tmp` may be left empty on the host: server.exit stays absent.)
        assert [p.name for p in half_written(s.local_dir)] in ([], ["server.exit.tmp"])
        assert not (s.local_dir / "server.exit").exists()
        # A launch on the full disk is refused with the reason, leaves no half file and starts nothing.
        with pytest.raises(HostError, match="No space left on device"):
            lab.launch(tiny_config(), name="no-room")
        assert not (lab.run_root / "no-room").exists() or half_written(lab.run_root / "no-room") == []
        no_processes_left(lab.run_root / "no-room")
        # Room again: the next verdict is saved whole.
        ballast.unlink()
        s.wait(timeout_s=30)
        wait_for(lambda: json.loads((s.local_dir / "readiness.json").read_text())["verdict"] == "CRASHED", "save")
    no_processes_left(lab.run_root)
