"""The docs site: it builds offline without a warning, documents every public name, and opens offline.

The build is Sphinx with warnings as errors, so a link to a page or an anchor that does not exist, a
cross-reference to a dsv4lab name that is not documented, or a docstring docutils cannot read fails it. The
checks that follow read what was built: every entry of every ``__all__`` in the package is in the site's
inventory (``objects.inv``) and has an anchor on its page; the blocking benchmark calls made by
``stoppable`` (module-level assignments) are there as functions with their signature; the pages ask for
nothing outside the site, and chromium, with the network blocked, loads them (and answers a search)
without a request leaving and without a console error.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.browser import launch_chromium, require_browser
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import publicapi  # noqa: E402 - docs/_ext is put on the path above

#: It starts servers, kernels or a browser (or builds the docs): `make unit` leaves it out.
pytestmark = pytest.mark.slow

#: A cold build takes about 30-50 s on two busy cores; this bound only catches a build that hangs.
BUILD_TIMEOUT_S = 300


@dataclass(frozen=True)
class Site:
    root: Path
    stderr: str
    returncode: int


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site built once for this file, as ``make docs`` builds it, into a folder of its own."""
    require(importlib.util.find_spec("sphinx") is not None, "Sphinx (pip install -e '.[docs]'; make installs it)")
    require(importlib.util.find_spec("myst_parser") is not None, "myst-parser (pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(out)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        cwd=ROOT,
    )
    return Site(out, proc.stderr, proc.returncode)


def _inventory(site: Site) -> dict[str, tuple[str, str]]:
    """``objects.inv``: dotted name -> (domain:role, page#anchor). Its format is Sphinx's version 2: four
    header lines, then zlib-compressed lines of ``name domain:role priority uri display``."""
    data = (site.root / "objects.inv").read_bytes()
    header_end = 0
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    assert data.startswith(b"# Sphinx inventory version 2"), data[:40]
    out = {}
    for line in zlib.decompress(data[header_end:]).decode().splitlines():
        match = re.match(r"(.+?)\s+(\S+:\S+)\s+(-?\d+)\s+(\S+)\s+(.*)", line)
        if match:
            name, role, _, uri, _ = match.groups()
            out[name] = (role, uri.replace("$", name))
    return out


def test_every_public_name_has_a_docstring() -> None:
    names = publicapi.public_names()
    assert len(names) > 500  # the walk found the package's __all__ lists
    missing = sorted({f"{n.path} ({n.kind}, exported by {n.module})" for n in names if not n.documented})
    assert missing == [], "public names without a docstring (a #: comment above a constant):\n" + "\n".join(missing)


@pytest.mark.slow  # builds the site (about 30 s of CPU)
def test_the_site_builds_offline_without_a_warning(site: Site) -> None:
    assert site.returncode == 0, f"sphinx-build failed ({site.returncode}):\n{site.stderr[-6000:]}"
    assert "WARNING" not in site.stderr and "ERROR" not in site.stderr, site.stderr[-6000:]
    assert (site.root / "index.html").is_file() and (site.root / "reference" / "index.html").is_file()


@pytest.mark.slow  # builds the site (about 30 s of CPU)
def test_every_public_name_is_in_the_reference(site: Site) -> None:
    inventory = _inventory(site)
    missing = []
    anchors_missing = []
    pages: dict[str, str] = {}
    for name in publicapi.public_names():
        entry = inventory.get(name.path)
        if entry is None:
            missing.append(f"{name.module}.{name.name} (defined at {name.path})")
            continue
        page, _, anchor = entry[1].partition("#")
        if page not in pages:
            pages[page] = (site.root / page).read_text(encoding="utf-8")
        if f'id="{anchor}"' not in pages[page]:
            anchors_missing.append(f"{name.path}: no id={anchor!r} in {page}")
    assert missing == [], "public names not in the built reference:\n" + "\n".join(missing)
    assert anchors_missing == [], "\n".join(anchors_missing)
    modules = {m for m in publicapi.modules_with_all()}
    assert modules - set(inventory) == set(), "modules with __all__ that the reference does not document"


@pytest.mark.slow  # builds the site (about 30 s of CPU)
def test_top_level_names_link_to_their_documentation(site: Site) -> None:
    """``dsv4lab.__all__`` is what users import; each name on the reference's front page links to its entry."""
    front = (site.root / "reference" / "index.html").read_text(encoding="utf-8")
    inventory = _inventory(site)
    top = [n for n in publicapi.public_names() if n.module == "dsv4lab"]
    assert {n.name for n in top} >= {"Lab", "Server", "ServerConfig", "preflight", "Interrupted", "__version__"}
    unlinked = [n.name for n in top if f'href="{inventory[n.path][1].split("/", 1)[-1]}"' not in front]
    assert unlinked == [], f"names in dsv4lab.__all__ the front page does not link: {unlinked}"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("path", "parameter", "says"),
    [
        ("dsv4lab.bench.runner.run", "workload", "blocking call"),
        ("dsv4lab.bench.runner.sweep", "concurrencies", "blocking call"),
        ("dsv4lab.bench.ab.run_ab", "concurrencies", "blocking call"),
    ],
)
def test_the_blocking_benchmark_calls_have_their_signature_and_docstring(
    site: Site, path: str, parameter: str, says: str
) -> None:
    """``run = stoppable(...)(run_async)`` is an assignment; the reference shows it as the function it is."""
    role, uri = _inventory(site)[path]
    assert role == "py:function", role
    page = (site.root / uri.partition("#")[0]).read_text(encoding="utf-8")
    start = page.index(f'id="{path}"')
    end = page.index("</dt>", start)  # the signature is the <dt>, the docstring the <dd> after it
    signature, doc = page[start:end], re.sub(r"<[^>]+>", "", page[end : end + 3000])
    assert f'<span class="n"><span class="pre">{parameter}</span></span>' in signature, signature[:2000]
    assert says in doc, doc[:2000]


@pytest.mark.slow  # builds the site (about 30 s of CPU)
def test_no_page_asks_for_anything_outside_the_site(site: Site) -> None:
    """Every script, stylesheet, image and font a page loads is a file of the site (links to other sites
    are plain ``<a href>`` and load nothing)."""
    loads = re.compile(r"<(?:script|link|img|source|iframe)\b[^>]*\b(?:src|href)=\"([^\"]+)\"", re.I)
    css_urls = re.compile(r"url\(\s*['\"]?([^'\")]+)")
    outside = []
    for page in site.root.rglob("*.html"):
        outside += [f"{page.name}: {u}" for u in loads.findall(page.read_text(encoding="utf-8")) if "//" in u]
    for sheet in site.root.rglob("*.css"):
        outside += [f"{sheet.name}: {u}" for u in css_urls.findall(sheet.read_text(encoding="utf-8")) if "//" in u]
    assert outside == []


@pytest.mark.slow
def test_the_site_opens_offline_in_chromium(site: Site, tmp_path: Path) -> None:
    """The home page, a reference page and a search, opened from the folder with the network blocked: nothing
    leaves, nothing fails. Search reads its index from a script beside it and fetches nothing (a browser
    refuses fetches between file:// pages), so it answers offline too."""
    require_browser()
    pages = {
        "index.html": "Where to read",
        "reference/bench.html": "Benchmarks of a running server",
        "search.html?q=preflight": "dsv4lab.model.memory.preflight",
    }
    requests: list[str] = []
    errors: list[str] = []
    with launch_chromium() as browser:
        context = browser.new_context(offline=True, viewport={"width": 1280, "height": 900})
        try:
            page = context.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
            for name, expected in pages.items():
                path, _, query = name.partition("?")
                page.goto((site.root / path).as_uri() + (f"?{query}" if query else ""), wait_until="load")
                if query:
                    page.wait_for_selector("#search-results li", timeout=30_000)
                page.screenshot(path=str(tmp_path / f"{path.replace('/', '_')}.png"))
                assert "dsv4lab" in page.title()
                assert expected in page.inner_text("body"), name
        finally:
            context.close()
    assert [r for r in requests if not r.startswith(("file:", "data:", "blob:", "about:"))] == []
    assert errors == []


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert "docs/index.md" in targets or any(t.startswith("docs/") for t in targets)
    broken = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert broken == []
