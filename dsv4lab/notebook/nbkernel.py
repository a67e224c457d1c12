"""The kernel manager headless runs use: Unix sockets, no heartbeat thread, and no interrupt for a kernel
that is already idle.

On a graceful shutdown jupyter_client interrupts the kernel first (SIGINT to its process group), so that a
busy one leaves its cell and can answer the shutdown request. papermill shuts the kernel down right after
the reply to its last ``kernel_info`` request, while the kernel may still be inside that request's handler,
where ipykernel lets SIGINT raise: the kernel then logs ``[IPKernelApp] ERROR | KeyboardInterrupt caught in
kernel.`` on the runner's terminal (``make demo``, sweeps) although every cell ended ok. An idle kernel has
nothing to interrupt, so the interrupt is sent only when the kernel does not show itself idle; a kernel
still running a cell (Ctrl-C of ``dsv4lab run``, a timeout) is interrupted as before.

The clients start no heartbeat channel. jupyter_client's heartbeat is a thread per client that pings the
kernel every second and, when no answer came in time, closes its socket and opens a new one; whether the
kernel lives is not taken from it when the client has a kernel manager (the manager polls the kernel's
process, and nbclient asks the manager). On a busy host the kernel's answer is late often enough that this
thread keeps re-creating its socket, and in a CI run one re-creation failed (``ZMQError: Too many open
files`` in the heartbeat thread of an in-process papermill run, reported as an unhandled thread exception).
A thread that cannot change the run's outcome and can fail on its own is left out.
"""

from __future__ import annotations

import asyncio
import queue
import time
from typing import Any

from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from traitlets import DottedObjectName, Type, Unicode

__all__ = ["IDLE_PROBE_S", "HeadlessKernelClient", "HeadlessKernelManager", "kernel_idle"]

#: How long a shutdown asks the kernel whether it is idle before interrupting it anyway.
IDLE_PROBE_S = 1.0
#: How long one probe waits for its answer before asking again (a new iopub subscriber can miss the first).
_ASK_EVERY_S = 0.25


class HeadlessKernelClient(AsyncKernelClient):
    """A client of a kernel its manager watches: every channel but the heartbeat (see the module doc)."""

    def start_channels(
        self, shell: bool = True, iopub: bool = True, stdin: bool = True, hb: bool = False, control: bool = True
    ) -> None:
        super().start_channels(shell, iopub, stdin, False, control)  # positional: no hb, whatever was asked


class HeadlessKernelManager(AsyncKernelManager):
    """A kernel reachable by this user only (Unix sockets, not a TCP port, and ipykernel does not warn that
    TCP traffic is unencrypted), whose clients run no heartbeat thread, shut down without a needless
    interrupt (see the module doc)."""

    transport = Unicode("ipc")
    client_class = DottedObjectName("dsv4lab.notebook.nbkernel.HeadlessKernelClient")
    client_factory = Type(HeadlessKernelClient, klass=AsyncKernelClient)

    async def _async_interrupt_kernel(self) -> None:
        if self.shutting_down and self.has_kernel and await kernel_idle(self, IDLE_PROBE_S):
            return
        await super()._async_interrupt_kernel()


async def kernel_idle(km: AsyncKernelManager, timeout_s: float) -> bool:
    """Whether the kernel answers a ``kernel_info`` request and goes idle after it within ``timeout_s``.

    A kernel handles its shell requests one after the other, so idle after this request means every earlier
    handler (papermill's last ``kernel_info``) has returned too. A kernel busy in a cell does not answer.
    """
    client: Any = km.client()
    client.start_channels()
    try:
        deadline = time.monotonic() + timeout_s
        asked: set[str] = set()
        while time.monotonic() < deadline:
            asked.add(client.kernel_info())
            until = min(deadline, time.monotonic() + _ASK_EVERY_S)
            while (left := until - time.monotonic()) > 0:
                try:
                    msg = await client.get_iopub_msg(timeout=left)
                except (queue.Empty, asyncio.TimeoutError):
                    break
                state = msg["content"].get("execution_state") if msg["msg_type"] == "status" else None
                if state == "idle" and msg["parent_header"].get("msg_id") in asked:
                    return True
        return False
    finally:
        client.stop_channels()
