"""One notebook run in a process of its own: ``python -m dsv4lab.notebook.pointrun SPEC.json``.

A sweep or a campaign that runs notebooks side by side (:mod:`dsv4lab.notebook.sidebyside`) starts one of these
per sweep point or campaign step. papermill's kernels started from threads of one process did not answer
(``Kernel didn't respond in 120 seconds`` for every run but the first, with the CPUs idle), so each run gets
what a single ``dsv4lab run`` has: its own process, papermill in its main thread, and Ctrl-C handled there
(the report of what ran is written). The spec names the notebook, its parameters, its run dir (made by the
caller), the per-cell timeout and whether cell output is echoed; the outcome is the run dir's
``results.json``, as for any run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsv4lab.errors import DSV4LabError, Interrupted
from dsv4lab.notebook.nbrun import run_notebook

__all__ = ["main"]


def main(argv: list[str]) -> int:
    """Run the point the spec file names; the exit status of ``dsv4lab run`` (0 ok, 1 failed, 130 stopped)."""
    if len(argv) != 1:
        print("usage: python -m dsv4lab.notebook.pointrun SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        run = run_notebook(
            spec["notebook"],
            spec["parameters"],
            run_dir=spec["run_dir"],
            execution_timeout_s=float(spec["execution_timeout_s"]),
            raise_on_error=False,
            log_output=bool(spec.get("log_output", False)),
        )
    except Interrupted:
        return 130
    except DSV4LabError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return exc.exit_code if hasattr(exc, "exit_code") else 1
    return 0 if run.ok else 1


if __name__ == "__main__":  # pragma: no cover - run as a process by a sweep or campaign
    sys.exit(main(sys.argv[1:]))
