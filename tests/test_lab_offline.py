"""``dsv4lab lab`` reaches nothing outside this machine: no news prompt, no update check, no extension
manager panel and a read-only manager behind it. Seen in a real JupyterLab started by ``start_lab`` and opened
in chromium with every request that is not for 127.0.0.1 refused and listed."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from dsv4lab.notebook.labserver import DISABLED_PLUGINS, LAB_CONFIG_DIR, LabServer, lab_argv, lab_env, start_lab
from tests.browser import launch_chromium, require_browser

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """``dsv4lab lab`` as the CLI starts it, with Jupyter's own dirs private to the test (no user settings)."""
    root = tmp_path_factory.mktemp("lab")
    env = {name: str(root / name.lower()) for name in ("JUPYTER_CONFIG_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTER_DATA_DIR")}
    (root / "nb").mkdir()
    server = start_lab(None, root / "nb", env=env)
    try:
        yield server
    finally:
        server.stop()


def test_the_command_line_and_the_config_turn_off_what_reaches_out(tmp_path: Path) -> None:
    argv = lab_argv(8888, tmp_path)
    assert "--LabApp.news_url=None" in argv
    assert "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate" in argv
    assert "--LabApp.extension_manager=readonly" in argv
    page = json.loads((LAB_CONFIG_DIR / "labconfig" / "page_config.json").read_text(encoding="utf-8"))
    assert page == {
        "disabledExtensions": dict.fromkeys(DISABLED_PLUGINS, True),
        "lockedExtensions": dict.fromkeys(DISABLED_PLUGINS, True),
    }
    env = lab_env({"JUPYTER_CONFIG_PATH": "/etc/mine"})
    assert env["JUPYTER_CONFIG_PATH"].split(":") == [str(LAB_CONFIG_DIR), "/etc/mine"]


def _api(lab: LabServer, path: str) -> Any:
    req = urllib.request.Request(f"http://127.0.0.1:{lab.port}/{path}", headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
        return json.loads(resp.read())


def test_the_server_fetches_no_news_and_checks_no_update(lab: LabServer) -> None:
    assert _api(lab, "lab/api/news") == {"news": []}
    assert _api(lab, "lab/api/update")["notification"] is None


def test_jupyterlab_in_a_browser_asks_nothing_and_fetches_nothing_from_outside(lab: LabServer, tmp_path: Path) -> None:
    require_browser()
    requested: list[str] = []
    refused: list[str] = []

    def only_loopback(route: Any) -> None:
        url = route.request.url
        requested.append(url)
        if urlsplit(url).hostname == "127.0.0.1":
            route.continue_()
        else:
            refused.append(url)
            route.abort()

    shot = tmp_path / "lab.png"
    with launch_chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.route("**/*", only_loopback)
        page = context.new_page()
        page.goto(lab.url, wait_until="domcontentloaded", timeout=60_000)
        page.wait_for_selector(".jp-Launcher", timeout=60_000)  # the app is up and restored
        page.wait_for_timeout(4000)  # the news prompt, when there is one, shows right after the restore
        config = json.loads(page.inner_text("#jupyter-config-data"))
        body = page.inner_text("body")
        toasts = page.locator(".Toastify__toast").count()
        extension_tabs = page.locator('li[data-id="extensionmanager.main-view"]').count()
        page.screenshot(path=str(shot))
        context.close()
    assert refused == [], refused
    assert requested and all(urlsplit(u).hostname == "127.0.0.1" for u in requested)
    assert not any("/lab/api/news" in u or "/lab/api/update" in u for u in requested), requested
    assert NEWS_PROMPT not in body and toasts == 0
    assert extension_tabs == 0  # no extension manager panel (a plain JupyterLab shows it in the left bar)
    assert set(DISABLED_PLUGINS) <= set(config["disabledExtensions"])
    assert config["news"] == {"disabled": True}
    assert config["extensionManager"]["name"] == "read-only" and config["extensionManager"]["can_install"] is False
    assert shot.stat().st_size > 10_000
