"""Real-browser checks: Debian's chromium driven by Playwright, JupyterLab on loopback, offline pages.

Playwright cannot download its own browser here, so it drives the system one (``executable_path``);
``make test`` installs Debian's ``chromium`` when it runs as root, like ``sshd``. Everything stays on this
machine: JupyterLab listens on 127.0.0.1 with a random port and token, and :func:`open_offline` blocks the
network for the page it opens and lists every request the page tried, so "the report needs nothing from
the internet" is one assertion. Tests call :func:`require_browser` first: a missing chromium or
Playwright skips locally and fails under ``CI=true``.

Reused by the report checks::

    check = open_offline(run.report, screenshot=tmp_path / "report.png")
    assert check.external_requests == [] and check.console_errors == []
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4lab.notebook.labserver import DISABLED_PLUGINS  # what `dsv4lab lab` switches off: the news prompt

__all__ = [
    "CHROMIUM_ARGS",
    "DISABLED_PLUGINS",
    "JupyterLab",
    "PageCheck",
    "chromium_path",
    "copy_notebooks",
    "launch_chromium",
    "open_offline",
    "playwright_available",
    "require_browser",
    "start_jupyterlab",
]

#: What chromium needs on these machines: no sandbox as root, no GPU, /dev/shm is small in containers; and
#: no background traffic to Google (refused here, and noise in the request list).
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
)


def chromium_path() -> str | None:
    """The system chromium (``DSV4LAB_CHROMIUM`` overrides), or None."""
    for candidate in (os.environ.get("DSV4LAB_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def playwright_available() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return False
    return True


def require_browser() -> str:
    """The chromium path; skips the test locally (fails under CI=true) when chromium or Playwright is missing."""
    from tests.conftest import require

    path = chromium_path()
    require(path is not None, "Debian's chromium (apt-get install chromium; `make chromium` does it as root)")
    require(playwright_available(), "the playwright package (pip install -e '.[dev]')")
    assert path is not None
    return path


@contextlib.contextmanager
def launch_chromium(*, timeout_s: float = 60.0) -> Iterator[Any]:
    """A headless chromium (Playwright ``Browser``) on the system binary, closed on exit."""
    from playwright.sync_api import sync_playwright

    path = require_browser()
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=path, headless=True, args=list(CHROMIUM_ARGS), timeout=timeout_s * 1000
        )
        try:
            yield browser
        finally:
            browser.close()


# -- offline pages ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PageCheck:
    """What a page did when opened with the network blocked."""

    url: str
    #: Every request the page tried (the page's own file:// URL included), in order.
    requests: list[str]
    #: Console messages of type "error", and uncaught page errors.
    console_errors: list[str]
    title: str
    screenshot: Path | None = None
    text: str = field(default="", repr=False)

    @property
    def external_requests(self) -> list[str]:
        """Requests that would have left the page: anything but file:, data:, blob: and about:."""
        return [r for r in self.requests if not r.startswith(("file:", "data:", "blob:", "about:"))]


def open_offline(
    html_path: Path,
    screenshot: Path | None = None,
    *,
    width: int = 1280,
    height: int = 900,
    timeout_s: float = 30.0,
    settle_s: float = 0.5,
) -> PageCheck:
    """Open a local HTML file in headless chromium with the network blocked; list what it tried to fetch.

    ``screenshot`` writes a full-page PNG. ``settle_s`` lets late requests (a script's ``import()``) show
    up in the list after the load event.
    """
    url = Path(html_path).resolve().as_uri()
    requests: list[str] = []
    errors: list[str] = []
    with launch_chromium(timeout_s=timeout_s) as browser:
        context = browser.new_context(offline=True, viewport={"width": width, "height": height})
        try:
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="load", timeout=timeout_s * 1000)
            page.wait_for_timeout(settle_s * 1000)
            if screenshot is not None:
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(screenshot), full_page=True)
            title = page.title()
            text = page.inner_text("body")
        finally:
            context.close()
    return PageCheck(url, requests, errors, title, screenshot, text)


# -- JupyterLab ---------------------------------------------------------------------------------------------------


def copy_notebooks(src: Path, dst: Path) -> Path:
    """A throwaway copy of ``src``'s notebooks (outputs a run writes stay out of the repository)."""
    dst.mkdir(parents=True, exist_ok=True)
    for nb in src.glob("*.ipynb"):
        shutil.copy2(nb, dst / nb.name)
    return dst


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class JupyterLab:
    """A JupyterLab server on 127.0.0.1 started for one test session."""

    port: int
    token: str
    root_dir: Path
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "lab") -> str:
        """A page URL with the token (``lab``, ``lab/tree/x.ipynb``)."""
        return f"{self.base_url}/{path.lstrip('/')}?token={self.token}"

    def api(self, method: str, path: str, *, timeout_s: float = 10.0) -> bytes:
        """Call the server's REST API (``GET api/kernels`` ...)."""
        req = urllib.request.Request(  # noqa: S310 - http on loopback, built here
            f"{self.base_url}/{path.lstrip('/')}",
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 - our own server on loopback
            return bytes(resp.read())

    def shutdown_kernels(self, timeout_s: float = 30.0) -> None:
        """Shut every kernel down the polite way, so each runs its atexit hooks (a Lab stops its servers)."""
        with contextlib.suppress(OSError, urllib.error.URLError):
            for kernel in json.loads(self.api("GET", "api/kernels")):
                with contextlib.suppress(OSError, urllib.error.URLError):
                    self.api("DELETE", f"api/kernels/{kernel['id']}", timeout_s=timeout_s)

    def stop(self, timeout_s: float = 20.0) -> None:
        self.shutdown_kernels()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def start_jupyterlab(root_dir: Path, *, timeout_s: float = 90.0, expose_app: bool = True) -> Iterator[JupyterLab]:
    """JupyterLab on 127.0.0.1 with a random port and token, ``root_dir`` as its root; stopped on exit.

    ``expose_app`` sets ``window.jupyterapp`` so a test can run JupyterLab commands (``notebook:run-all-cells``)
    instead of hunting for menu items. As root it needs ``--allow-root``.
    """
    port, token = _free_port(), secrets.token_hex(16)
    log_path = root_dir.parent / f"jupyterlab-{port}.log"
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root_dir}",
        "--ServerApp.open_browser=False",
        "--LabApp.news_url=None",  # no news feed from the internet
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    ]
    if expose_app:
        argv.append("--LabApp.expose_app_in_browser=True")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        argv.append("--allow-root")
    # A config dir of its own: the user's ~/.jupyter (settings, workspaces) stays out, and the news prompt,
    # which would sit on top of what a screenshot shows, is switched off.
    config_dir = root_dir.parent / f"jupyter-config-{port}"
    (config_dir / "labconfig").mkdir(parents=True, exist_ok=True)
    (config_dir / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {plugin: True for plugin in DISABLED_PLUGINS}}), encoding="utf-8"
    )
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir)}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=root_dir, env=env)
    lab = JupyterLab(port, token, root_dir, proc, log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:  # bounded: until the API answers, the process dies, or the deadline
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {proc.returncode}:\n{lab.log()[-3000:]}")
            try:
                lab.api("GET", "api/status", timeout_s=2.0)
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"JupyterLab did not answer in {timeout_s:.0f} s:\n{lab.log()[-3000:]}"
                    ) from None
                time.sleep(0.25)
        yield lab
    finally:
        lab.stop()
