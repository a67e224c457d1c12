"""The twin's process tree: forked scheduler ranks and a detokenizer that die with the main process.

Children are forked before the event loop starts (cheap: no new interpreter), ask the kernel to SIGKILL
them when their parent dies (``prctl(PR_SET_PDEATHSIG)``, as SGLang's ``kill_itself_when_parent_died``)
and otherwise sleep. The main process tears the tree down the way SGLang's ``kill_process_tree`` does:
SIGKILL to every child, then — when the parent is included — to itself, which is why a crashed SGLang
exits with status 137.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dsv4lab.twin.logfmt import LogWriter

__all__ = ["Child", "fork_child", "kill_process_tree", "set_parent_death_signal"]

PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class Child:
    """A forked process of the twin's tree (a scheduler rank, the detokenizer), by the name SGLang gives it."""

    name: str
    pid: int


def fork_child(name: str, body: Callable[[], None], keep_fds: Sequence[int] = ()) -> Child:
    """Fork a child that runs ``body`` and never returns into the caller's code."""
    parent = os.getpid()
    pid = os.fork()
    if pid:
        return Child(name, pid)
    code = 0
    try:
        set_parent_death_signal()
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the main process, as in SGLang
        body()
    except BaseException:
        code = 1
    finally:
        os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def kill_process_tree(
    children: Sequence[Child], log: LogWriter | None, *, include_parent: bool, logs_call: bool
) -> None:
    """SGLang's teardown: SIGKILL every child; with ``include_parent`` SIGKILL this process too (exit 137)."""
    me = os.getpid()
    if logs_call and log is not None:
        log.log(f"kill_process_tree called: parent_pid={me}, include_parent={include_parent}, pid={me}")
    for child in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0  # reap, so no zombie outlives the tree; bounded
    for child in children:
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(child.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if done:
                break
            time.sleep(0.005)
    if include_parent:
        os.kill(me, signal.SIGKILL)
