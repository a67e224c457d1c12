"""``dsv4lab lab``: JupyterLab on the shipped notebooks, reachable from this machine only, with a token.

The panel and the notebooks drive machines that cost money per hour over SSH keys the user holds; a
JupyterLab that listens on every interface, or without a token, hands all of that to anyone on the
network. So the server started here binds 127.0.0.1 (reach it from elsewhere through ``ssh -L``), gets a
fresh random token (passed in its environment, not on its command line where ``ps`` shows it to every
user), and runs with ``--allow-root`` only when it is root (Jupyter refuses root otherwise).

Nothing in it reaches out of this machine on its own. JupyterLab's announcements plugin (the "get notified
about official Jupyter news?" prompt, whose Yes fetches a feed from the internet, and the update check) and
its extension manager panel (which offers to search PyPI) are switched off and locked by a page config
shipped in ``dsv4lab/jupyter_config``, first on ``JUPYTER_CONFIG_PATH`` (below the user's own config); on
the server side there is no news URL, no update check, and the extension manager is read-only.

Without ``--notebooks`` it works on a copy of the shipped notebooks in ``./dsv4lab-notebooks`` (made 0700;
files already there are left alone, so edits survive the next start), never on the installed package.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dsv4lab.errors import ConfigError, DSV4LabError
from dsv4lab.resources import JUPYTER_CONFIG

__all__ = [
    "DISABLED_PLUGINS",
    "LAB_CONFIG_DIR",
    "LOOPBACK",
    "LabServer",
    "free_port",
    "lab_argv",
    "lab_env",
    "notebook_folder",
    "run_lab",
    "start_lab",
]

#: The only address the server listens on.
LOOPBACK = "127.0.0.1"
#: Where the shipped notebooks are copied when no folder is named.
DEFAULT_FOLDER = "dsv4lab-notebooks"
#: JupyterLab plugins switched off (and locked off): the news prompt and update check, and the extension
#: manager's panel (whose "this panel needs to fetch data from web services, activate?" would ask for PyPI).
DISABLED_PLUGINS = ("@jupyterlab/apputils-extension:announcements", "@jupyterlab/extensionmanager-extension:plugin")
#: A Jupyter config dir of dsv4lab's: ``labconfig/page_config.json`` disables and locks :data:`DISABLED_PLUGINS`.
LAB_CONFIG_DIR = JUPYTER_CONFIG
#: Server settings that keep JupyterLab from fetching anything: no news feed, no update check, and an
#: extension manager that lists the installed extensions instead of searching PyPI.
_OFFLINE_ARGS = (
    "--LabApp.news_url=None",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    "--LabApp.extension_manager=readonly",
)


def notebook_folder(path: str | Path | None) -> Path:
    """The folder JupyterLab opens: ``path`` (it must exist), or a private copy of the shipped notebooks."""
    if path is not None:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ConfigError("--notebooks", str(path), "an existing folder of notebooks")
        return folder.resolve()
    from dsv4lab.notebook.nbrun import NOTEBOOK_DIR

    folder = Path(DEFAULT_FOLDER).resolve()
    folder.mkdir(mode=0o700, exist_ok=True)
    for nb in sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        if not (folder / nb.name).exists():
            shutil.copyfile(nb, folder / nb.name)
    return folder


def free_port() -> int:
    """A port free on loopback now, for JupyterLab (it binds 127.0.0.1 only)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def lab_argv(port: int, folder: Path, *, python: str = sys.executable) -> list[str]:
    """JupyterLab's command line: loopback only, this port only, the folder, no browser, nothing fetched from
    the internet; no token here."""
    argv = [
        python,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.ip={LOOPBACK}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--ServerApp.root_dir={folder}",
        "--ServerApp.allow_remote_access=False",
        *_OFFLINE_ARGS,
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    return argv


def lab_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with dsv4lab's Jupyter config dir first on ``JUPYTER_CONFIG_PATH`` (the user's own config
    dir still outranks it, as Jupyter always puts that first)."""
    paths = [str(LAB_CONFIG_DIR), *(p for p in base.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep) if p)]
    return {**base, "JUPYTER_CONFIG_PATH": os.pathsep.join(paths)}


@dataclass
class LabServer:
    """A running JupyterLab started by :func:`start_lab`."""

    process: subprocess.Popen[bytes]
    port: int
    token: str
    folder: Path

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/lab?token={self.token}"

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL what is left after ``timeout_s`` (its kernels go with it)."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=5.0)


def start_lab(
    port: int | None = None,
    notebooks: str | Path | None = None,
    *,
    env: dict[str, str] | None = None,
    ready_timeout_s: float = 90.0,
) -> LabServer:
    """Start JupyterLab (see the module doc) and return once it answers on its port."""
    if port is not None and not 1 <= port <= 65535:
        raise ConfigError("--port", port, "a TCP port, 1-65535 (or none for a free one)")
    folder = notebook_folder(notebooks)
    chosen = port if port is not None else free_port()
    token = secrets.token_hex(24)
    child_env = {**lab_env({**os.environ, **(env or {})}), "JUPYTER_TOKEN": token}
    proc = subprocess.Popen(
        lab_argv(chosen, folder),
        env=child_env,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = LabServer(proc, chosen, token, folder)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DSV4LabError(
                f"JupyterLab exited with status {proc.returncode} before it answered on {LOOPBACK}:{chosen} "
                "(its messages are above; is the port taken?)"
            )
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, chosen), timeout=0.5):
            return server
        time.sleep(0.2)
    server.stop()
    raise DSV4LabError(f"JupyterLab did not answer on {LOOPBACK}:{chosen} within {ready_timeout_s:.0f} s")


def run_lab(port: int | None, notebooks: str | None) -> int:
    """The ``dsv4lab lab`` command: start, print the URL with its token, wait until Ctrl-C or the server ends."""
    server = start_lab(port, notebooks)
    tunnel = f"ssh -L {server.port}:{LOOPBACK}:{server.port} THIS_HOST"
    print(f"JupyterLab on {server.folder}, for this machine only (from elsewhere: {tunnel})", file=sys.stderr)
    print(server.url, flush=True)
    try:
        return server.process.wait()
    except KeyboardInterrupt:
        server.stop()
        return 130
