"""Sphinx configuration for dsv4lab's docs: Markdown pages (MyST), the reference from docstrings (autodoc).

Built offline by ``make docs`` into ``site/``; ``tests/test_docs.py`` builds it with warnings as errors, so a
broken link, a missing anchor or a cross-reference to nothing fails ``make test``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

from dsv4lab.resources import __version__  # noqa: E402 - after the path is set

project = "dsv4lab"
author = "dsv4lab"
copyright = "dsv4lab contributors"
release = version = __version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "dsv4lab_docs"]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "_ext"]
root_doc = "index"

# Pages: GitHub's Markdown, with an anchor for every heading down to ### so pages can link to sections,
# and those links are checked.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The reference: docstrings as written (reST; the few with a Google-style "Args:" section through napoleon, see
# docs/_ext/dsv4lab_docs.py), members in source order, long signatures one parameter a line.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autoclass_content = "both"  # a class's docstring, then its __init__'s (Lab's and ConfigPanel's Args)
maximum_signature_line_length = 100
add_module_names = False
python_display_short_literal_types = True

# Every cross-reference must resolve: into dsv4lab, or it is a broken link. Names from other libraries (no
# inventory is fetched: the build is offline) and the standard library are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!dsv4lab\b).*")]

html_theme = "furo"
html_title = f"dsv4lab {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
html_copy_source = False
# Search results without the text around the match: the summary is fetched from each result page, which a
# browser refuses for file:// pages, and the site is opened from disk.
html_show_search_summary = False
html_last_updated_fmt = None
