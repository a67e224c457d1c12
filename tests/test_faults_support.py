"""Helpers shared by the fault-matrix tests (``tests/test_faults_*.py``); no tests of its own.

Everything here drives real parts: twin processes, the real sshd fixture, papermill kernels, psutil to
find what is still running. Every wait is a bounded loop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nbformat
import psutil

from dsv4lab.config.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]

#: Twin durations x this: a tiny-profile startup takes about a second.
SCALE = 0.02


def tiny_config(**changes: Any) -> ServerConfig:
    """A config the tiny hardware profile holds (TP 2), for rows where the story's model is not the point."""
    base = ServerConfig(model_path="dsv4lab/tiny-moe", tp=2, mem_fraction_static=0.8)
    return base.replace(**changes) if changes else base


def wait_for(check: Callable[[], object], what: str, timeout_s: float = 60.0, every_s: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)


def processes_of(run_dir: str | Path) -> list[int]:
    """Live (non-zombie) processes that belong to a run dir: its launch script (named in the command line)
    and the server processes (their working directory is the run dir)."""
    needle = str(run_dir)
    found: list[int] = []
    for p in psutil.process_iter(["cmdline", "cwd", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            cwd = p.info["cwd"] or ""
            if needle in " ".join(p.info["cmdline"] or []) or cwd == needle or cwd.startswith(needle + "/"):
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def no_processes_left(run_dir: str | Path, timeout_s: float = 15.0) -> None:
    """Nothing of the run dir may still run (a bounded wait: a tree takes a moment to end)."""
    deadline = time.monotonic() + timeout_s
    left = processes_of(run_dir)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = processes_of(run_dir)
    assert not left, f"processes of {run_dir} still running: {[_describe(p) for p in left]}"


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_tree_now(pid: int) -> None:
    """SIGKILL a process and its descendants from outside (the OOM killer, a careless `kill -9`)."""
    try:
        root = psutil.Process(pid)
        tree = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in reversed(tree):
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()


def _describe(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}"
    except psutil.NoSuchProcess:
        return f"{pid} (gone)"


def cli(
    args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout_s: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """``python -m dsv4lab ARGS`` as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "dsv4lab", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, **(env or {})},
        cwd=cwd or ROOT,
        check=False,
    )


def _as_a_terminal_job() -> None:
    """In the child before exec: SIGINT and SIGTERM as a shell gives a foreground job (default, unblocked).

    An ignored signal is inherited through exec, and Python leaves an ignored SIGINT ignored: a test worker
    that some earlier test left ignoring it would start a runner that no Ctrl-C reaches (seen in 3 of 3 full
    suites: the notebook ran on to the end and exited 0, while the test alone passed every time)."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})


def signal_dispositions(pid: int) -> str:
    """``SigBlk``/``SigIgn`` of a process (``/proc``): what a failed Ctrl-C test shows about its target."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"(no /proc/{pid}/status: {exc})"
    return " ".join(line.replace("\t", " ") for line in lines if line.startswith(("SigBlk", "SigIgn")))


def cli_popen(
    args: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[str]:
    """``python -m dsv4lab ARGS`` started as a terminal's job: its own process group (Ctrl-C reaches it all),
    SIGINT and SIGTERM at their defaults whatever the test worker inherited."""
    return subprocess.Popen(
        [sys.executable, "-m", "dsv4lab", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=cwd or ROOT,
        start_new_session=True,
        preexec_fn=_as_a_terminal_job,
    )


def write_notebook(path: Path, parameters: str, cells: Sequence[str], *, title: str = "Fault drill") -> Path:
    """A small parameterized notebook: a title, a ``parameters`` cell (``name: type = value  # help`` lines,
    plus ``run_dir``), then ``cells``."""
    nb = nbformat.v4.new_notebook()  # type: ignore[no-untyped-call]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell(  # type: ignore[no-untyped-call]
        parameters.strip() + "\nrun_dir: str = ''  # where the runner put this run"
    )
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        nbformat.v4.new_markdown_cell(f"# {title}"),  # type: ignore[no-untyped-call]
        params,
        *(nbformat.v4.new_code_cell(c) for c in cells),  # type: ignore[no-untyped-call]
    ]
    nbformat.write(nb, str(path))  # type: ignore[no-untyped-call]
    return path


#: The first cell of notebooks that start a tiny twin server in their run dir.
LAUNCH_TINY = (
    "from pathlib import Path\n"
    "from dsv4lab import Lab\n"
    "from dsv4lab.config.server_config import ServerConfig\n"
    f"lab = Lab(run_root=run_dir, hardware='tiny', pace={SCALE}, progress=False)\n"
    "s = lab.launch(ServerConfig(model_path='dsv4lab/tiny-moe', tp=2, mem_fraction_static=0.8), name='tiny').wait()\n"
    "print(s.state)"
)
