"""A headless run ends its kernel quietly: no interrupt for a kernel that is already idle (it once printed
``[IPKernelApp] ERROR | KeyboardInterrupt caught in kernel.`` after a run where every step ended ok), and
still an interrupt for one that is busy in a cell; and it runs no heartbeat thread in the runner's process
(one failed in CI, see :mod:`dsv4lab.notebook.nbkernel`)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from jupyter_client.channels import HBChannel

from dsv4lab.notebook.nbkernel import HeadlessKernelManager
from dsv4lab.notebook.nbrun import run_notebook
from tests.test_faults_support import cli, wait_for, write_notebook

pytestmark = pytest.mark.slow

STRAY = "KeyboardInterrupt caught in kernel"

#: A process in the kernel's process group (jupyter_client interrupts the whole group) that records
#: whether a SIGINT came, and says so once the kernel is gone.
WITNESS = """
import os, signal, sys, time
out, parent = sys.argv[1], os.getppid()
def note(what):
    with open(out, 'a') as f:
        f.write(what + '\\n')
signal.signal(signal.SIGINT, lambda *_: note('SIGINT'))
signal.signal(signal.SIGTERM, lambda *_: (note('SIGTERM'), sys.exit(0)))
note('ready')
while os.getppid() == parent:
    time.sleep(0.02)
note('kernel gone')
"""


def test_a_run_that_ends_ok_does_not_interrupt_its_idle_kernel(tmp_path: Path) -> None:
    seen = tmp_path / "witness"
    notebook = write_notebook(
        tmp_path / "quiet.ipynb",
        "x: int = 1  # a parameter",
        [
            "import subprocess, sys, time\n"
            "from pathlib import Path\n"
            f"witness = subprocess.Popen([sys.executable, '-c', {WITNESS!r}, {str(seen)!r}])\n"
            f"while not Path({str(seen)!r}).exists():\n"
            "    time.sleep(0.02)",
            # Busy threads make the kernel slow to leave a request's handler: where the stray line came from.
            "import threading\n"
            "def spin():\n"
            "    while True:\n"
            "        sum(range(1000))\n"
            "for _ in range(3):\n"
            "    threading.Thread(target=spin, daemon=True).start()",
            "print(x)",
        ],
        title="Quiet",
    )
    out = cli(["run", str(notebook), "--reports", str(tmp_path / "reports")], timeout_s=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ended = ("kernel gone", "SIGTERM")
    wait_for(lambda: any(e in seen.read_text() for e in ended), "the kernel to end", timeout_s=30)
    # Shut down without an interrupt: the kernel had nothing to interrupt.
    assert "SIGINT" not in seen.read_text().split(), seen.read_text()
    assert STRAY not in out.stderr + out.stdout
    assert "[IPKernelApp] ERROR" not in out.stderr


def test_a_kernel_busy_in_a_cell_is_still_interrupted_at_shutdown(tmp_path: Path) -> None:
    seen = tmp_path / "witness"

    async def go() -> float:
        km = HeadlessKernelManager(kernel_name="python3", connection_file=str(tmp_path / "kernel.json"))
        await km.start_kernel(cwd=str(tmp_path))
        client = km.client()
        client.start_channels()
        try:
            await client.wait_for_ready(timeout=120)
            client.execute(
                f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {WITNESS!r}, {str(seen)!r}])"
            )
            client.execute("time.sleep(120)")  # still running when the shutdown comes
            await asyncio.to_thread(wait_for, seen.exists, "the witness to start", 60)
            started = time.monotonic()
            await km.shutdown_kernel()
            return time.monotonic() - started
        finally:
            client.stop_channels()

    took = asyncio.run(go())
    wait_for(lambda: "SIGTERM" in seen.read_text() or "kernel gone" in seen.read_text(), "the kernel to end", 30)
    assert "SIGINT" in seen.read_text().split(), seen.read_text()  # the running cell was interrupted
    assert took < 10.0  # after the idle probe (about 1 s), not after a kill timeout


def test_a_headless_run_starts_no_heartbeat_thread_and_still_sees_its_kernel_die(tmp_path: Path) -> None:
    """The threads of this process are watched while a notebook runs in it (as papermill runs in a sweep's or
    a test's process): no heartbeat channel. A kernel that dies mid-cell is still seen, from its process."""
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(type(t).__name__ for t in threading.enumerate() if isinstance(t, HBChannel))
            seen.add("watched")
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, name="hb-watch", daemon=True)
    watcher.start()
    try:
        ok = write_notebook(tmp_path / "ok.ipynb", "x: int = 1  # a number", ["import time\ntime.sleep(1.0)\nx + 1"])
        run = run_notebook(ok, {}, reports_root=tmp_path / "reports", execution_timeout_s=120)
        died = write_notebook(tmp_path / "dies.ipynb", "x: int = 1  # a number", ["import os\nos._exit(3)"])
        dead = run_notebook(died, {}, reports_root=tmp_path / "reports", execution_timeout_s=120, raise_on_error=False)
    finally:
        done.set()
        watcher.join(timeout=5)
    assert run.ok, run.error
    assert seen == {"watched"}, seen
    assert not dead.ok and dead.error is not None and "died" in dead.error.lower(), dead.error
