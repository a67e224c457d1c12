"""A real Jupyter kernel for tests: run cells, press Stop (interrupt) mid-cell, read what came back.

The Stop button of JupyterLab is ``KernelManager.interrupt_kernel()`` (SIGINT to the kernel process);
nothing here is simulated.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jupyter_client.manager import KernelManager


@dataclass
class CellResult:
    status: str
    ename: str | None
    evalue: str | None
    stdout: str
    stderr: str
    #: Monotonic time the kernel's reply arrived.
    replied_at: float
    outputs: list[dict[str, Any]] = field(default_factory=list)
    #: The lines a front end shows for the cell's error (the iopub ``error`` message's ``traceback``).
    traceback: list[str] = field(default_factory=list)


class Kernel:
    """One ipykernel process of this interpreter, with a client attached."""

    def __init__(self, cwd: Path, env: dict[str, str] | None = None) -> None:
        self.km = KernelManager(kernel_name="python3")
        import os

        self.km.start_kernel(cwd=str(cwd), env={**os.environ, **(env or {})})
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    @property
    def pid(self) -> int:
        provisioner = self.km.provisioner
        assert provisioner is not None
        return int(provisioner.process.pid)  # type: ignore[attr-defined]

    def submit(self, code: str) -> str:
        """Start running a cell; returns its message id (the cell runs until :meth:`collect`)."""
        return str(self.kc.execute(code, store_history=True))

    def collect(self, msg_id: str, timeout_s: float = 300.0) -> CellResult:
        """Wait for the cell's reply and gather its output."""
        deadline = time.monotonic() + timeout_s
        reply: dict[str, Any] | None = None
        while reply is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"the cell did not finish within {timeout_s} s")
            try:
                msg = self.kc.get_shell_msg(timeout=min(remaining, 1.0))
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                reply = msg
        replied_at = time.monotonic()
        stdout: list[str] = []
        stderr: list[str] = []
        outputs: list[dict[str, Any]] = []
        traceback: list[str] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=0.5)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                (stdout if content["name"] == "stdout" else stderr).append(content["text"])
            elif kind in ("display_data", "execute_result", "update_display_data"):
                outputs.append(content)
            elif kind == "error":
                traceback = list(content["traceback"])
            elif kind == "status" and content["execution_state"] == "idle":
                break
        body = reply["content"]
        return CellResult(
            body["status"],
            body.get("ename"),
            body.get("evalue"),
            "".join(stdout),
            "".join(stderr),
            replied_at,
            outputs,
            traceback,
        )

    def run(self, code: str, timeout_s: float = 300.0) -> CellResult:
        result = self.collect(self.submit(code), timeout_s)
        if result.status != "ok":
            raise AssertionError(f"cell failed: {result.ename}: {result.evalue}\n{result.stderr}")
        return result

    def value(self, expression: str) -> str:
        """The repr of an expression evaluated in the kernel."""
        reply = self.kc.execute_interactive(
            "", user_expressions={"v": expression}, timeout=60, output_hook=lambda _: None
        )
        data = reply["content"]["user_expressions"]["v"]
        if data["status"] != "ok":
            raise AssertionError(f"{expression}: {data.get('ename')}: {data.get('evalue')}")
        return str(data["data"]["text/plain"])

    def interrupt(self) -> float:
        """Press Stop; returns the monotonic time it was pressed."""
        pressed = time.monotonic()
        self.km.interrupt_kernel()
        return pressed

    def shutdown(self, *, now: bool = False) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=now)
