"""Notebook runs side by side: each in a process of its own (:mod:`dsv4lab.notebook.pointrun`), a few at a time.

Sweeps and campaigns on a Slurm placement run several notebooks at once and let the scheduler decide which of
their servers start now and which wait in the queue. Each notebook gets what a single ``dsv4lab run`` has — its
own process, papermill in its main thread, Ctrl-C handled there — because papermill kernels started from
threads of one process stopped answering (see :mod:`dsv4lab.notebook.pointrun`). A run's outcome is its run
dir's record, read back with :func:`~dsv4lab.notebook.nbrun.read_run`. The caller decides what to start and
when (a sweep's next point, a campaign's next step whose inputs are ready); this class only runs them.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

from dsv4lab.notebook.nbrun import NotebookRun, read_run, stop_orphans

__all__ = ["INTERRUPT_GRACE_S", "POLL_S", "NotebookProcesses"]

T = TypeVar("T")

#: How often the running processes are looked at: a finished run is noticed (and the next started) this soon.
POLL_S = 0.2
#: After a Stop, how long a run has to write its report of what ran before its process is killed.
INTERRUPT_GRACE_S = 60.0


class NotebookProcesses(Generic[T]):
    """The notebook runs started and not yet collected, each under the caller's tag (a sweep point, a step)."""

    def __init__(self, execution_timeout_s: float, *, log_output: bool = False) -> None:
        self.execution_timeout_s = execution_timeout_s
        self.log_output = log_output
        self._running: list[tuple[subprocess.Popen[bytes], T, Path, Path, dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self._running)

    def start(self, tag: T, notebook: Path, params: Mapping[str, Any], run_dir: Path) -> None:
        """Start ``notebook`` with ``params`` into ``run_dir`` (made by the caller) in a process of its own."""
        spec = run_dir / "point.json"
        spec.write_text(
            json.dumps(
                {
                    "notebook": str(notebook),
                    "parameters": dict(params),
                    "run_dir": str(run_dir),
                    "execution_timeout_s": self.execution_timeout_s,
                    "log_output": self.log_output,
                }
            ),
            encoding="utf-8",
        )
        proc = subprocess.Popen([sys.executable, "-m", "dsv4lab.notebook.pointrun", str(spec)])
        self._running.append((proc, tag, notebook, run_dir, dict(params)))

    def finished(self, wait_s: float = POLL_S) -> list[tuple[T, NotebookRun]]:
        """The runs that ended (after waiting up to ``wait_s`` for one to end), each with its record."""
        deadline = time.monotonic() + wait_s
        while True:
            done = [entry for entry in self._running if entry[0].poll() is not None]
            if done or time.monotonic() >= deadline:
                break
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        out: list[tuple[T, NotebookRun]] = []
        for entry in done:
            self._running.remove(entry)
            _, tag, notebook, run_dir, params = entry
            with contextlib.suppress(OSError):
                (run_dir / "point.json").unlink()  # params.json keeps the parameters
            out.append((tag, read_run(notebook, run_dir, params)))
        return out

    def interrupt(self, grace_s: float = INTERRUPT_GRACE_S) -> list[tuple[T, NotebookRun]]:
        """Stop every run as Ctrl-C stops one (its report is written), kill what has not ended after ``grace_s``,
        and stop the servers each left (their Slurm jobs cancelled); returns each run's tag and its record."""
        for proc, *_ in self._running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + grace_s
        out: list[tuple[T, NotebookRun]] = []
        for proc, tag, notebook, run_dir, params in self._running:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
            stop_orphans(run_dir)
            with contextlib.suppress(OSError):
                (run_dir / "point.json").unlink()
            out.append((tag, read_run(notebook, run_dir, params)))
        self._running.clear()
        return out
